"""Straggler avoidance: the pure policy, and the gate over a real job directory."""

from __future__ import annotations

import time

from data_juicer_elastic.coordination.stragglers import ClaimGate, observe, should_claim
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import TakeoverReason
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.sharedfs import fault_seam

from ..jobdir.conftest import copy_runner, identity, make_rows, request, write_rows


def test_equal_speeds_never_decline():
    assert all(should_claim(10.0, [10.0] * n, p) for n in range(1, 8) for p in range(1, 5))


def test_a_4x_slower_node_leaves_the_last_shards_to_fast_ones():
    fast = [12.0, 12.0, 24.0]  # two fast workers and a 2x one are running
    assert not should_claim(48.0, fast, 3)  # they finish 3 pending shards before it finishes one
    assert should_claim(48.0, fast, 8)  # plenty left: it helps
    assert should_claim(48.0, [], 1), "nobody else running: always claim"
    assert should_claim(None, fast, 1), "no estimate yet: claim"


def test_a_2x_slower_node_declines_only_the_very_last_shard():
    assert not should_claim(24.0, [12.0], 1)
    assert should_claim(24.0, [12.0], 2)


def test_the_gate_counts_only_live_claims_of_other_workers(tmp_path):
    job = tmp_path / "job"
    prepare_job(request(job, write_rows(tmp_path / "in.jsonl", make_rows(40)), 4))

    def slow(task):
        time.sleep(0.05)
        return copy_runner()(task)

    run_worker(
        job,
        identity("slow"),
        slow,
        WorkerSettings(ttl_secs=60, heartbeat_secs=10, max_retries=0, poll_interval_secs=0.1),
    )
    pace = observe(JobLayout(job), load_manifest(job))
    assert pace.pending == 0 and pace.running == [] and pace.secs_by_node["slow"] > 0.04
    gate = ClaimGate(JobLayout(job), load_manifest(job), "slow", 1, min_interval=0)
    assert gate(), "nobody else is running: never decline"


def _tail_job(tmp_path, pending: int):
    """'slow' finished 3 shards at 40 s each, 'fast' 3 at 10 s; 'fast' holds 3 live claims now;
    ``pending`` shards were never claimed."""
    from data_juicer_elastic.jobdir import heartbeats, task_queue
    from data_juicer_elastic.jobdir.records import AttemptRecord, ShardResult
    from data_juicer_elastic.sharedfs import fsio

    shards = 9 + pending
    job = tmp_path / "job"
    prepare_job(request(job, write_rows(tmp_path / "in.jsonl", make_rows(shards)), shards))
    layout, manifest = JobLayout(job), load_manifest(job)
    fsio.makedirs(layout.done_dir)
    for i, entry in enumerate(manifest.shards[:6]):
        node, secs = ("slow", 40.0) if i < 3 else ("fast", 10.0)
        attempt = f"{node}-{i}"
        fsio.makedirs(layout.attempt_dir(entry.shard_id, attempt))
        fsio.makedirs(layout.claim_dir(entry.shard_id))
        record = AttemptRecord(entry.shard_id, attempt, 1, node, "h", "b", 1, 100.0 * i, 100.0 * i + secs)
        fsio.write_new(layout.attempt_record(entry.shard_id, attempt), record.encode())
        result = ShardResult(entry.shard_id, attempt, 1, node, 1, 1, "0" * 64, "x", 1, "0", 1.0)
        fsio.write_new(layout.done(entry.shard_id), result.encode())
    fast = identity("fast", boot_id="elsewhere")
    for entry in manifest.shards[6:9]:
        claim = task_queue.publish_claim(
            layout, task_queue.read_lease(layout, entry.shard_id), fast, "f", TakeoverReason.FIRST
        )
        heartbeats.write_heartbeat(layout, claim, 1)
    return layout, manifest


def test_the_gate_reads_live_claims_only_in_the_tail(tmp_path):

    lease_reads = []
    fault_seam.set_fault_hook(lambda op, path: lease_reads.append(path) if "/claims/part-" in str(path) else None)
    try:
        layout, manifest = _tail_job(tmp_path / "tail", pending=2)
        lease_reads.clear()
        tail = ClaimGate(layout, manifest, "slow", 1, min_interval=0)()
        tail_reads = len(lease_reads)
        layout, manifest = _tail_job(tmp_path / "early", pending=40)
        lease_reads.clear()
        early = ClaimGate(layout, manifest, "slow", 1, min_interval=0)()
    finally:
        fault_seam.set_fault_hook(None)
    # 3 fast workers finish 3 x floor(40/10 - 1/2) = 9 shards before 'slow' finishes one
    assert not tail and tail_reads > 0, "2 pending: the leases are read and the slow node declines"
    assert early and lease_reads == [], "40 never-claimed shards > 3 claims x 3: allowed from two listings"
