"""Fault matrix row 20: recovery paths that used to dead-end.

A done shard whose accepted output was deleted or altered (or whose done marker is corrupt)
is named by ``merge`` and ``verify`` with the command that requeues it, ``retry --shard-id``
requeues it (a valid one is refused), and the next worker runs it at once: the merge is then
exact.  An input shard that is a symlink out of the job directory is refused, never read.
"""

from __future__ import annotations

import json
import os

import pytest

from .commands import SHARD0, dj_elastic, error_line, finished_job, tree
from .conftest import run_driver, summary_of
from .fakes import merged_ids

DAMAGE = {
    "deleted": lambda output, marker: output.unlink(),
    "altered": lambda output, marker: output.write_bytes(output.read_bytes().replace(b'"id"', b'"ID"', 1)),
    "corrupt-marker": lambda output, marker: (marker.unlink(), marker.write_text("{not json")),
}


# "altered" in the default run (the subtlest: the file is there, its bytes differ); all three in
# the extended run.
@pytest.mark.parametrize(
    "damage", [pytest.param(d, marks=() if d == "altered" else pytest.mark.extended) for d in sorted(DAMAGE)]
)
def test_a_done_shard_whose_result_is_gone_is_named_requeued_and_run_again(tmp_path, damage):
    job = finished_job(tmp_path)
    marker = job / "done" / f"{SHARD0}.json"
    output = job / json.loads(marker.read_bytes())["output"]
    DAMAGE[damage](output, marker)

    line = error_line(dj_elastic("verify", "--job-dir", job))
    assert SHARD0 in line and f"dj-elastic retry --job-dir {job} --shard-id {SHARD0}" in line
    line = error_line(dj_elastic("merge", "--job-dir", job, "--output", tmp_path / "merged.jsonl"))
    assert SHARD0 in line and "dj-elastic retry" in line

    refused = error_line(dj_elastic("retry", "--job-dir", job, "--shard-id", "part-00001-of-00004"))
    assert "output is valid" in refused
    proc = dj_elastic("retry", "--job-dir", job, "--shard-id", SHARD0)
    assert proc.returncode == 0 and f"requeued 1 shard(s): {SHARD0}" in proc.stdout, proc.stderr[-2000:]
    assert dj_elastic("status", "--job-dir", job).returncode == 1, "the requeued shard is pending again"
    assert any(p.name == "done.json" for p in (job / "history" / SHARD0).rglob("*")), "the marker is archived"

    # A fresh worker claims it at once (no lease TTL to wait: --no-wait would leave it undone).
    worker = run_driver("worker", str(job), "--ttl", "600", "--no-wait")
    assert worker.returncode == 0 and summary_of(worker)["done"] == 1, worker.stderr[-2000:]
    proc = dj_elastic("merge", "--job-dir", job, "--output", tmp_path / "merged.jsonl")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert merged_ids(tmp_path / "merged.jsonl") == list(range(40))


def test_an_input_shard_linked_out_of_the_job_dir_is_refused_by_workers_and_verify(tmp_path):
    job = finished_job(tmp_path, shards=4)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shard = job / "shards" / f"{SHARD0}.jsonl"
    copy = outside / shard.name
    copy.write_bytes(shard.read_bytes())  # the same bytes: only the link itself is wrong
    shard.unlink()
    shard.symlink_to(copy)
    line = error_line(dj_elastic("verify", "--job-dir", job))
    assert "leads outside the job directory" in line and str(shard) in line

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    from .fakes import prepare

    job2 = prepare(fresh)
    shard2 = job2 / "shards" / f"{SHARD0}.jsonl"
    copy2 = outside / "second.jsonl"
    copy2.write_bytes(shard2.read_bytes())
    shard2.unlink()
    shard2.symlink_to(copy2)
    before = tree(outside)
    worker = run_driver("worker", str(job2), "--ttl", "600", "--no-wait")
    line = error_line(worker)
    assert "leads outside the job directory" in line
    assert not (job2 / "done" / f"{SHARD0}.json").exists() and tree(outside) == before
    assert not list((job2 / "failures").rglob("*.json")), "the shard is not to blame: no retry is spent"
    os.unlink(shard2)
