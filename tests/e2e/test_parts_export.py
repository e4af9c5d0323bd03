"""`export_layout: parts` through the real commands: `dj-process` publishes the parts (against the input
itself and the `file` layout's merge of the same job), `dj-elastic verify` checks them, and
Data-Juicer's own loaders read the directory as the dataset: `dj-analyze` and `dj-process` with the
`default` executor see exactly the rows in order, the `ray` executor exactly the rows."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest

from data_juicer_elastic.jobdir.exports import PARTS_INDEX
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.parts import publish_parts
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job
from data_juicer_elastic.sharedfs.identity import WorkerIdentity
from tests.rayfree import rayfree_runner

from .conftest import assert_ok, elastic_recipe, read_jsonl, read_ray_output, run, write_recipe

pytestmark = [pytest.mark.e2e]

STATS = "__dj__stats__"
FILTER = [{"text_length_filter": {"min_len": 10, "max_len": 10000}}]


def _parts_rows(export: Path) -> list[dict]:
    index = json.loads((export / PARTS_INDEX).read_bytes())
    return [row for part in index["parts"] for row in read_jsonl(export / part["name"])]


@pytest.fixture(scope="module")
def parts_run(tmp_path_factory, demo_input):
    tmp = tmp_path_factory.mktemp("parts")
    recipe = elastic_recipe(tmp, demo_input, process=FILTER, num_shards=4, export_layout="parts")
    text = recipe.read_text().replace(str(tmp / "job" / "merged.jsonl"), str(tmp / "job" / "parts"))
    recipe.write_text(text)
    proc = run(["dj-process", "--config", str(recipe)], cwd=tmp)
    assert_ok(proc)
    return tmp, recipe, proc


@pytest.mark.ray
def test_dj_process_publishes_the_rows_of_the_input_that_pass_in_order_as_the_file_layout_would(parts_run, demo_input):
    tmp, _, proc = parts_run
    export, job = tmp / "job" / "parts", tmp / "job" / "job"
    expected = [row for row in read_jsonl(demo_input) if 10 <= len(row["text"]) <= 10000]
    assert 0 < len(expected) < 600 and _parts_rows(export) == expected, "exactly the input's passing rows"
    index = json.loads((export / PARTS_INDEX).read_bytes())
    stats = [row[STATS]["text_len"] for part in index["parts"] for row in read_jsonl(export / part["stats_name"])]
    assert stats == [len(row["text"]) for row in expected], "each part's per-row stats beside it, in row order"
    console = proc.stdout + proc.stderr
    assert "as parts in" in console and f"index {PARTS_INDEX}" in console, console[-2000:]
    merged = tmp / "merged.jsonl"
    assert_ok(
        run(["dj-elastic", "merge", "--job-dir", str(job), "--output", str(merged), "--export-layout", "file"], cwd=tmp)
    )
    assert b"".join((export / p["name"]).read_bytes() for p in index["parts"]) == merged.read_bytes()
    assert_ok(run(["dj-elastic", "merge", "--job-dir", str(job), "--output", str(export)], cwd=tmp))  # the job's layout
    verify = run(["dj-elastic", "verify", "--job-dir", str(job)], cwd=tmp)
    assert_ok(verify)
    assert f"PASS: export {export} (parts: {len(expected)} rows" in verify.stdout


@pytest.mark.ray
@pytest.mark.extended
def test_running_the_finished_job_again_leaves_the_export_as_it_is(parts_run):
    tmp, recipe, _ = parts_run
    index = tmp / "job" / "parts" / PARTS_INDEX
    before = (index.read_bytes(), index.stat().st_mtime_ns, index.stat().st_ino)
    proc = run(["dj-process", "--config", str(recipe)], cwd=tmp)
    assert_ok(proc)
    assert (index.read_bytes(), index.stat().st_mtime_ns, index.stat().st_ino) == before
    console = proc.stdout + proc.stderr
    assert "already held these" in console and "identical: left unchanged" in console, console[-2000:]
    assert not re.search(r"(merged|published) [\d,]+ rows", console), "no line claims it wrote the export"


@pytest.fixture(scope="module")
def many_parts(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A parts export of 32 parts (listing order on ext4 is not name order) with per-row stats files,
    built without Ray; its rows in order."""
    tmp = tmp_path_factory.mktemp("loaders")
    rows = [{"id": i, "text": "x" * (3 + (i * 7919) % 97), STATS: {"len": i}} for i in range(320)]
    data = tmp / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = tmp / "job"
    prepare_job(
        PrepareRequest(job_dir=job, dataset_path=data, num_shards=32, recipe={"process": []}, stage_identities=[])
    )
    run_worker(
        job,
        WorkerIdentity.current(),
        rayfree_runner(job),
        WorkerSettings(ttl_secs=60, heartbeat_secs=10, max_retries=0, poll_interval_secs=0.2),
    )
    export = tmp / "parts"
    publish_parts(job, export)
    assert len(list(export.glob("*.stats"))) == 32
    return export, [{k: v for k, v in row.items() if k != STATS} for row in rows]


def test_dj_analyze_reads_the_parts_directory_as_the_dataset_in_order(many_parts, tmp_path):
    export, rows = many_parts
    recipe = write_recipe(
        tmp_path / "analyze.yaml",
        dataset_path=str(export),
        export_path=str(tmp_path / "analysis" / "out.jsonl"),
        process=[{"text_length_filter": {"min_len": 0, "max_len": 100000}}],
    )
    assert_ok(run(["dj-analyze", "--config", str(recipe)], cwd=tmp_path))
    stats = read_jsonl(tmp_path / "analysis" / "out_stats.jsonl")
    assert [s[STATS]["text_len"] for s in stats] == [len(r["text"]) for r in rows], "every row once, in order"


def test_dj_process_with_the_default_executor_reads_exactly_the_rows_in_order(many_parts, tmp_path):
    export, rows = many_parts
    recipe = write_recipe(
        tmp_path / "default.yaml",
        executor_type="default",
        dataset_path=str(export),
        export_path=str(tmp_path / "out" / "rows.jsonl"),
        process=[{"text_length_filter": {"min_len": 0, "max_len": 100000}}],
    )
    assert_ok(run(["dj-process", "--config", str(recipe)], cwd=tmp_path))
    assert read_jsonl(tmp_path / "out" / "rows.jsonl") == rows


@pytest.mark.ray
@pytest.mark.extended
def test_dj_process_with_the_ray_executor_reads_exactly_the_rows(many_parts, tmp_path):
    export, rows = many_parts
    recipe = write_recipe(
        tmp_path / "ray.yaml",
        executor_type="ray",
        ray_address="local",
        dataset_path=str(export),
        export_path=str(tmp_path / "out" / "rows.jsonl"),
        process=[{"text_length_filter": {"min_len": 0, "max_len": 100000}}],
    )
    assert_ok(run(["dj-process", "--config", str(recipe)], cwd=tmp_path))
    got = [{k: v for k, v in row.items() if k != STATS} for row in read_ray_output(tmp_path / "out" / "rows.jsonl")]
    canonical = collections.Counter(json.dumps(r, sort_keys=True) for r in got)
    assert canonical == collections.Counter(json.dumps(r, sort_keys=True) for r in rows)
