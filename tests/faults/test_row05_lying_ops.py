"""Matrix row 5: an operation that succeeded but reported failure; transient ESTALE.

A retransmitted NFS link/rename can answer EIO/EEXIST for a call that happened. The worker
must recognise its own publication (the bytes name its attempt), and retry a transient
ESTALE a bounded number of times.
"""

from __future__ import annotations

import pytest

from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

from .crashpoints import FaultRule, injected
from .fakes import LEASE, done_shards, fsio_runner, merged_ids, prepare

FIRST = "part-00000-of-00004"


def _run(job):
    return run_worker(job, WorkerIdentity.current("n"), fsio_runner(), WorkerSettings(max_retries=1, **LEASE))


@pytest.mark.parametrize(
    "op, path",
    [("link", "/done/"), ("link", "/claims/"), ("link", "/releases/"), ("replace", "result.json"),
     ("replace", "/heartbeats/"), ("link", "manifest.json")],
)  # fmt: skip
def test_operation_that_succeeded_but_reported_eio_is_recognised_as_ours(tmp_path, op, path):
    job = prepare(tmp_path)
    with injected(FaultRule(op, "EIO", path=path, mode="lie", times=None)) as plan:
        summary = _run(job)
        out = merge_job(job, tmp_path / "out.jsonl")
    if path != "manifest.json":  # (prepared before the plan: a control that must not fire)
        assert plan.injected, "the lie was told"
    assert summary.complete and summary.done == 4 and summary.failed == 0
    assert merged_ids(out.output_path) == list(range(40))
    assert all(record["generation"] == 1 for record in done_shards(job).values()), "nothing was redone"


def test_transient_estale_on_publication_is_retried(tmp_path):
    job = prepare(tmp_path)
    with injected(FaultRule("link", "ESTALE", path="/done/", times=2)) as plan:
        summary = _run(job)
    assert len(plan.injected) == 2 and summary.done == 4 and summary.failed == 0


def test_persistent_estale_is_bounded_then_a_failed_attempt_naming_the_path(tmp_path):
    job = prepare(tmp_path)
    with injected(FaultRule("link", "ESTALE", path=f"/done/{FIRST}", times=None)) as plan:
        summary = _run(job)
    # 4 link tries per attempt, 2 attempts (max_retries=1): bounded, no storm
    assert len(plan.injected) == 8
    assert not JobLayout(job).done(FIRST).exists()
    ((shard, error),) = summary.terminal_failures
    assert shard == FIRST and "Stale file handle" in error and f"done/{FIRST}.json" in error


@pytest.mark.parametrize("op", ["read", "open"])
def test_transient_estale_on_reads_is_retried(tmp_path, op):
    job = prepare(tmp_path)
    with injected(FaultRule(op, "ESTALE", path="/done/", times=2)) as plan:
        summary = _run(job)
    assert len(plan.injected) == 2 and summary.complete and summary.failed == 0


def test_atomic_write_whose_rename_happened_but_reported_eio_succeeds(tmp_path):
    """Regression: atomic_write raised (and the attempt failed) for a rename that had happened."""
    target = tmp_path / "r.json"
    with injected(FaultRule("replace", "EIO", mode="lie")):
        fsio.atomic_write(target, b"ours")
    assert target.read_bytes() == b"ours"
    target.write_bytes(b"theirs")
    with injected(FaultRule("replace", "EIO")), pytest.raises(OSError):  # really failed: raised
        fsio.atomic_write(target, b"ours")
    assert target.read_bytes() == b"theirs" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
