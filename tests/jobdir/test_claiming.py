"""The claim cursor (jobdir/claiming.py): what a walk visits, and the metadata operations a
claim costs on a real job directory, counted through fsio's hook (not timed)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from data_juicer_elastic.coordination.stragglers import ClaimGate
from data_juicer_elastic.jobdir import claiming, heartbeats, task_queue
from data_juicer_elastic.jobdir.claiming import MAX_JUMPS, ClaimCursor
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import ShardResult, TakeoverReason
from data_juicer_elastic.jobdir.worker import WorkerSettings, keeper_in_loop, run_worker
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.sharedfs import fault_seam, fsio

from .conftest import copy_runner, identity, make_rows, request, write_rows

WEIGHT = {"makedirs": 3, "write": 0}  # one op = one fsio call; makedirs(exist_ok) is 3 syscalls


# -- the cursor alone ------------------------------------------------------------------------------------
def test_a_walk_visits_every_shard_not_retired_once_from_the_position_wrapping():
    cursor = ClaimCursor(10, random.Random(0), start=7)
    for i in (8, 2, 3):
        cursor.retire(i)
    assert list(cursor.walk()) == [7, 9, 0, 1, 4, 5, 6]
    assert cursor.remaining == 7 and not cursor.retire(8), "retiring twice counts once"


def test_jumps_are_bounded_and_the_walk_still_covers_everything():
    cursor = ClaimCursor(50, random.Random(3))
    seen = []
    for i in cursor.walk():
        seen.append(i)
        cursor.jump()  # every probe: someone else's
    assert sorted(seen) == list(range(50))
    for k in range(MAX_JUMPS + 1, 50):  # after MAX_JUMPS jumps: the next unvisited index, cyclically
        step = 1
        while (seen[k - 1] + step) % 50 in seen[:k]:
            step += 1
        assert seen[k] == (seen[k - 1] + step) % 50, k
    assert seen[: MAX_JUMPS + 1] != list(range(seen[0], seen[0] + MAX_JUMPS + 1)), "the first probes jumped"


def test_retiring_during_a_walk_ends_it_early_and_claimed_moves_the_start():
    cursor = ClaimCursor(6, random.Random(0))
    seen = []
    for i in cursor.walk():
        seen.append(i)
        if i == 0:
            for j in range(1, 6):
                cursor.retire(j)  # learned from a listing mid-walk
    assert seen == [0]
    cursor.claimed(0)
    assert cursor.position == 1 and list(cursor.walk()) == [0]


# -- counted metadata operations on a real job directory ------------------------------------------------
class _ClaimOps:
    """Counts fsio operations made inside Claimer.claim_next, and the claims it returns.

    Only the calling thread's operations count: the claim-ahead helper, the heartbeat and the
    publication run on other threads at the same time, and how much of their work falls inside a
    claim would otherwise depend on the machine's load."""

    def __init__(self, monkeypatch):
        self.ops = self.calls = self.claims = 0
        self.inside: set[int] = set()
        self.trace: list[tuple[str, str]] = []
        original = claiming.Claimer.claim_next

        def counted(claimer):
            me = threading.get_ident()
            self.inside.add(me)
            try:
                got, finished = original(claimer)
            finally:
                self.inside.discard(me)
            self.calls += 1
            self.claims += got is not None
            return got, finished

        monkeypatch.setattr(claiming.Claimer, "claim_next", counted)

    def __call__(self, op: str, path: Path) -> None:
        if threading.get_ident() in self.inside:
            self.ops += WEIGHT.get(op, 1)
            self.trace.append((op, str(path)))


def _mid_job(tmp_path: Path, shards: int) -> Path:
    """A job more than half done by 'other workers' (the first half and every 4th shard after it), with
    the next three shards held by a live peer: what a worker joining late finds."""
    job = tmp_path / f"job-{shards}"
    prepare_job(request(job, write_rows(tmp_path / f"in-{shards}.jsonl", make_rows(shards)), shards))
    layout, manifest = JobLayout(job), load_manifest(job)
    fsio.makedirs(layout.done_dir)
    half = shards // 2
    done = [e for i, e in enumerate(manifest.shards) if i < half or i % 4 == 0]
    for entry in done:
        fsio.makedirs(layout.claim_dir(entry.shard_id))
        result = ShardResult(entry.shard_id, "other-1", 1, "peer", entry.rows, 1, "0" * 64, "x", entry.rows, "0", 1.0)
        fsio.write_new(layout.done(entry.shard_id), result.encode(), durable=False)
    peer = identity("peer", boot_id="elsewhere")
    for entry in manifest.shards[half + 1 : half + 4]:
        claim = task_queue.publish_claim(
            layout, task_queue.read_lease(layout, entry.shard_id), peer, "p-1", TakeoverReason.FIRST
        )
        heartbeats.write_heartbeat(layout, claim, 1)
    return job


def _claim_ops(job: Path, monkeypatch, claims: int, job_summary: bool = True) -> _ClaimOps:
    with monkeypatch.context() as patch:
        return _count_claims(job, _ClaimOps(patch), claims, job_summary)


def _count_claims(job: Path, counter: _ClaimOps, claims: int, job_summary: bool = True) -> _ClaimOps:
    layout, manifest = JobLayout(job), load_manifest(job)
    # The gate as the executor builds it; a frozen clock keeps its first answer (one observe()).
    gate = ClaimGate(layout, manifest, "node-a", 1, min_interval=1.0, clock=lambda: 0.0)
    fault_seam.set_fault_hook(counter)
    try:
        run_worker(
            job,
            identity(),
            copy_runner(),
            WorkerSettings(
                ttl_secs=60.0,
                heartbeat_secs=10.0,
                max_retries=1,
                poll_interval_secs=0.01,
                max_shards=claims or None,
                wait_for_completion=False,
                job_summary=job_summary,
            ),
            claim_gate=gate,
            claim_rng=random.Random(7),
        )
    finally:
        fault_seam.set_fault_hook(None)
    assert counter.claims == claims
    return counter


@pytest.mark.extended  # a 1,000-shard job prepared and walked: a large case
def test_ops_per_claim_do_not_grow_with_the_number_of_shards(tmp_path, monkeypatch):
    # The walk (a worker without a summary it trusts): with one, a claim reads no shard it skips, and
    # whether the keeper's thread has written a round yet would make the count a matter of timing.
    small = _claim_ops(_mid_job(tmp_path, 100), monkeypatch, claims=20, job_summary=False)
    big = _claim_ops(_mid_job(tmp_path, 1000), monkeypatch, claims=20, job_summary=False)
    per_small, per_big = small.ops / small.claims, big.ops / big.claims
    # Before the cursor a fresh worker read each of the 500+ done markers and every held
    # shard in front of its first claim, and the gate read all 1,000 shards: > 50 ops per
    # claim at 1,000 shards.  Now: one done/ listing, a probe or two and the publication
    # per claim, plus one gate read bounded by live claims and its span sample.
    assert per_big <= per_small + 2, (per_small, per_big)
    assert per_big < 30, per_big
    listings = [p for op, p in big.trace if op == "listdir" and p.endswith("/done")]
    assert len(listings) == 2, "one listing for the claim cursor, one for the gate, not one per claim"


def test_learning_that_everything_is_done_takes_one_listing(tmp_path, monkeypatch):
    job = _mid_job(tmp_path, 500)
    layout, manifest = JobLayout(job), load_manifest(job)
    for entry in manifest.shards:  # the rest done too
        if layout.done(entry.shard_id).exists():
            continue
        result = ShardResult(entry.shard_id, "other-2", 1, "peer", entry.rows, 1, "0" * 64, "x", entry.rows, "0", 1.0)
        fsio.write_new(layout.done(entry.shard_id), result.encode(), durable=False)
    counter = _claim_ops(job, monkeypatch, claims=0)
    # one look for a job summary (there is none: no writer ran yet), then one listing of done/
    assert counter.calls == 1
    assert counter.trace == [("read", str(layout.summary_seq)), ("listdir", str(layout.done_dir))]


def test_a_held_shard_is_reread_only_when_it_could_be_stale_then_taken_over(tmp_path, clock):
    job = tmp_path / "job"
    prepare_job(request(job, write_rows(tmp_path / "in.jsonl", make_rows(80)), 8))
    layout = JobLayout(job)
    held = "part-00002-of-00008"
    ghost = identity("ghost", boot_id="elsewhere")
    heartbeats.write_heartbeat(
        layout,
        task_queue.publish_claim(layout, task_queue.read_lease(layout, held), ghost, "g-1", TakeoverReason.FIRST),
        1,
    )
    lease_reads: list[float] = []

    def hook(op: str, path: Path) -> None:
        if op == "listdir" and path == layout.claim_dir(held):
            lease_reads.append(clock.now)

    def slow_runner(task):
        clock.advance(25.0)  # each shard takes 25 s of the worker's clock; TTL is 60 s
        return copy_runner()(task)

    fault_seam.set_fault_hook(hook)
    try:
        summary = run_worker(
            job,
            identity("rescuer"),
            slow_runner,
            WorkerSettings(ttl_secs=60.0, heartbeat_secs=10.0, max_retries=3, poll_interval_secs=1.0),
            clock=clock,
            drive_keeper=keeper_in_loop,
            sleep=clock.advance,
            claim_rng=random.Random(0),
        )
    finally:
        fault_seam.set_fault_hook(None)
    assert summary.complete and summary.claimed == 8
    view = task_queue.read_lease(layout, held)
    assert view.generation == 2 and view.claim.takeover_reason == TakeoverReason.STALE
    # First sight, then nothing until a TTL had passed on our clock, then the takeover
    # (the takeover's own read of the new generation is the last one).
    assert len(lease_reads) <= 3, lease_reads
    assert lease_reads[1] - lease_reads[0] >= 60.0


@pytest.mark.parametrize("workers", [3])
def test_concurrent_cursors_claim_each_shard_once_and_spread_out(tmp_path, workers):
    """Three workers (threads, each with its own cursor) on one job: every shard done once, and
    all exit as soon as the job is done."""
    import threading

    job = tmp_path / "job"
    prepare_job(request(job, write_rows(tmp_path / "in.jsonl", make_rows(60)), 30))
    results = []

    def work(k):
        def run(task):
            time.sleep(0.002)
            return copy_runner()(task)

        results.append(
            run_worker(
                job,
                identity(f"w{k}", boot_id=f"boot-{k}"),
                run,
                WorkerSettings(ttl_secs=60.0, heartbeat_secs=10.0, max_retries=1, poll_interval_secs=0.01),
                claim_rng=random.Random(k),
            )
        )

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)  # the TTL is 60 s: a worker that waited for a held shard's TTL to see it done would still run
    assert not any(t.is_alive() for t in threads), "idle workers notice at once that held shards got done"
    assert sum(r.done for r in results) == 30 and all(r.complete for r in results)
    for shard in load_manifest(job).shard_ids:
        assert len(list((job / "attempts" / shard).iterdir())) == 1
