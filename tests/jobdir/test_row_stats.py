"""jobdir.exports: the per-row stats file of every attempt, published with its result, merged
beside the export in row order, and validated by merge and verify (Ray-free runner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.execution.row_writer import ExportLayout
from data_juicer_elastic.jobdir.exports import export_stats_path
from data_juicer_elastic.jobdir.records import ShardResult
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.shards.verify import verify_job

from ..rayfree import rayfree_runner
from .conftest import identity, request, write_rows

STATS = "__dj__stats__"
LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=0.5, max_retries=0)


def rows() -> list[dict]:
    return [
        {"id": i, "text": f"row {i}", "x": [1e-12, 193, -0.0][i % 3], STATS: {"len": i, "r": i / 7}} for i in range(40)
    ]


def finished(tmp_path: Path, layout: ExportLayout = ExportLayout()) -> Path:
    data = write_rows(tmp_path / "in.jsonl", rows())
    job = tmp_path / "job"
    prepare_job(request(job, data, 4))
    assert run_worker(job, identity(), rayfree_runner(job, layout), WorkerSettings(**LEASE)).complete
    return job


def results(job: Path) -> list[ShardResult]:
    return [ShardResult.parse(p.read_bytes(), p) for p in sorted((job / "done").iterdir())]


@pytest.mark.parametrize(
    "name, expected", [("merged.jsonl", "merged_stats.jsonl"), ("out.json", "out_stats.jsonl"), ("x", "x_stats.jsonl")]
)
def test_the_name_is_data_juicers(name, expected):
    assert export_stats_path(Path("/o") / name) == Path("/o") / expected


def test_stats_go_beside_the_export_in_row_order_and_merging_again_changes_nothing(tmp_path):
    job = finished(tmp_path)
    assert all(r.row_stats is not None for r in results(job))
    out = tmp_path / "out" / "merged.jsonl"
    first = merge_job(job, out)
    merged = [json.loads(line) for line in out.open()]
    stats = [json.loads(line) for line in export_stats_path(out).open()]
    assert [r["id"] for r in merged] == list(range(40)) and all(STATS not in r for r in merged)
    assert stats == [{STATS: row[STATS]} for row in rows()]
    assert [r["x"] for r in merged] == [row["x"] for row in rows()] and str(merged[2]["x"]) == "-0.0"
    again = merge_job(job, out)
    assert first.row_stats.sha256 == again.row_stats.sha256 and not again.row_stats.written
    assert json.loads((job / "merge.json").read_text())["row_stats_sha256"] == first.row_stats.sha256
    verify_job(job)


def test_keep_stats_in_res_ds_keeps_them_in_the_rows_too(tmp_path):
    job = finished(tmp_path, ExportLayout(keep_stats=True))
    out = tmp_path / "merged.jsonl"
    merge_job(job, out)
    assert [json.loads(line)[STATS] for line in out.open()] == [row[STATS] for row in rows()]
    assert export_stats_path(out).is_file()


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_a_damaged_row_stats_file_fails_merge_and_verify_naming_the_shard(tmp_path, damage):
    job = finished(tmp_path)
    victim = results(job)[2]
    path = job / victim.row_stats.path
    if damage == "flip":
        path.write_bytes(path.read_bytes().replace(b'"len":', b'"len" :', 1))
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-7])
    else:
        path.unlink()
    for check in (lambda: merge_job(job, tmp_path / "merged.jsonl"), lambda: verify_job(job)):
        with pytest.raises(IntegrityError) as info:
            check()
        assert info.value.where == f"shard {victim.shard_id}"
    assert not (tmp_path / "merged.jsonl").exists() and not (tmp_path / "merged_stats.jsonl").exists()


def test_a_different_stats_file_at_the_export_refuses_the_merge_before_anything_is_published(tmp_path):
    from data_juicer_elastic.errors import OutputExistsError

    job = finished(tmp_path)
    out = tmp_path / "merged.jsonl"
    export_stats_path(out).write_text('{"someone": "else"}\n')
    with pytest.raises(OutputExistsError) as info:
        merge_job(job, out)
    assert info.value.where == str(export_stats_path(out))
    assert not out.exists(), "the output is not published when its stats file cannot be"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [], "no temp files left"
    merge_job(job, out, overwrite=True)
    assert len(export_stats_path(out).read_text().splitlines()) == 40
