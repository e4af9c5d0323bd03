"""`dj-elastic clean` on a job `dj-process` finished with real Ray: the shard outputs go, the export stays
byte for byte (the input's passing rows, in order), `verify` still finds a tampered export, `status` works,
and running the recipe again confirms the export without running a shard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import assert_ok, elastic_recipe, read_jsonl, run

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.extended]

FILTER = [{"text_length_filter": {"min_len": 10, "max_len": 10000}}]


def _sizes(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, demo_input):
    tmp = tmp_path_factory.mktemp("clean")
    recipe = elastic_recipe(tmp, demo_input, process=FILTER, num_shards=4)
    assert_ok(run(["dj-process", "--config", str(recipe)], cwd=tmp))
    return tmp, recipe, tmp / "job" / "job", tmp / "job" / "merged.jsonl"


def test_clean_keeps_the_output_once_and_verify_status_and_a_rerun_still_work(finished, demo_input):
    tmp, recipe, job, export = finished
    expected = [row for row in read_jsonl(demo_input) if 10 <= len(row["text"]) <= 10000]
    assert 0 < len(expected) < 600 and read_jsonl(export) == expected
    before, merged = _sizes(job), export.read_bytes()
    outputs = {p: size for p, size in before.items() if p.name in ("output.jsonl", "row-stats.jsonl")}
    attempts = sorted((job / "attempts").glob("*/*"))
    assert len(outputs) == 2 * 4, "each shard's output and its row stats"

    proc = run(["dj-elastic", "clean", "--job-dir", str(job)], cwd=tmp)
    assert_ok(proc)
    freed = sum(outputs.values())
    assert f"removed {len(outputs)} file(s), freed {freed:,} bytes" in proc.stdout, proc.stdout
    after = _sizes(job)
    assert not set(outputs) & set(after) and sum(after.values()) < sum(before.values()) - freed + 4096
    assert export.read_bytes() == merged, "the export is untouched"

    verify = run(["dj-elastic", "verify", "--job-dir", str(job)], cwd=tmp)
    assert_ok(verify)
    assert f"PASS: export {export} (file: {len(expected)} rows" in verify.stdout
    status = run(["dj-elastic", "status", "--job-dir", str(job), "--json"], cwd=tmp)
    assert_ok(status)
    assert json.loads(status.stdout)["complete"] is True

    mtime = export.stat().st_mtime_ns
    rerun = run(["dj-process", "--config", str(recipe)], cwd=tmp)
    assert_ok(rerun)
    assert "already in" in rerun.stdout + rerun.stderr and "shard outputs were cleaned" in rerun.stdout + rerun.stderr
    assert sorted((job / "attempts").glob("*/*")) == attempts, "no shard ran again"
    assert (export.read_bytes(), export.stat().st_mtime_ns) == (merged, mtime)

    export.write_bytes(merged.replace(b"data", b"DATA", 1))  # one edit, same size: only a re-hash finds it
    bad = run(["dj-elastic", "verify", "--job-dir", str(job)], cwd=tmp)
    assert bad.returncode == 2 and "do not match its accepted output" in bad.stderr, bad.stderr[-2000:]
    bad = run(["dj-process", "--config", str(recipe)], cwd=tmp)
    assert bad.returncode == 2 and "shard outputs were cleaned" in bad.stderr, bad.stderr[-2000:]
    export.write_bytes(merged)
