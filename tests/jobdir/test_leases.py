from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time

import pytest

from data_juicer_elastic.jobdir import heartbeats, task_queue
from data_juicer_elastic.jobdir.layout import JobLayout, shard_id
from data_juicer_elastic.jobdir.records import Claim, Failure, TakeoverReason
from data_juicer_elastic.sharedfs import fault_seam, fsio

from .conftest import FakeClock, identity

SHARD = "part-00000-of-00004"
TTL = 60.0


def claim(layout, who, reason=None):
    view = task_queue.read_lease(layout, SHARD)
    return task_queue.publish_claim(layout, view, who, who.new_attempt_id(), reason or TakeoverReason.FIRST)


def test_first_claim_wins_and_a_second_for_the_same_generation_loses(job):
    layout = JobLayout(job)
    a, b = identity("a"), identity("b")
    view = task_queue.read_lease(layout, SHARD)
    assert view.generation == 0
    won = task_queue.publish_claim(layout, view, a, a.new_attempt_id(), TakeoverReason.FIRST)
    lost = task_queue.publish_claim(layout, view, b, b.new_attempt_id(), TakeoverReason.FIRST)
    assert won is not None and won.generation == 1 and lost is None
    after = task_queue.read_lease(layout, SHARD)
    assert after.generation == 1 and after.claim == won


def test_held_claim_is_not_claimable_until_ttl_on_the_observers_clock(job, clock):
    layout = JobLayout(job)
    holder, me = identity("holder"), identity("me")
    c = claim(layout, holder)
    heartbeats.write_heartbeat(layout, c, 1)
    observer = task_queue.StalenessObserver(TTL, clock)
    view = lambda: task_queue.read_lease(layout, SHARD)  # noqa: E731
    assert task_queue.takeover_reason(view(), me, observer) is None
    clock.advance(TTL - 1)
    assert task_queue.takeover_reason(view(), me, observer) is None, "no premature takeover"
    heartbeats.write_heartbeat(layout, c, 2)  # the holder is alive: the value changed
    assert task_queue.takeover_reason(view(), me, observer) is None  # first seen now
    clock.advance(TTL - 1)
    assert task_queue.takeover_reason(view(), me, observer) is None
    clock.advance(1)
    assert task_queue.takeover_reason(view(), me, observer) == TakeoverReason.STALE
    taken = task_queue.publish_claim(layout, view(), me, me.new_attempt_id(), TakeoverReason.STALE)
    assert taken.generation == 2 and taken.takeover_of == 1 and taken.takeover_reason == "stale"


def test_fresh_observer_waits_a_full_ttl_even_for_an_old_claim(job):
    layout = JobLayout(job)
    c = claim(layout, identity("holder"))
    heartbeats.write_heartbeat(layout, c, 1)
    old_observer_clock, new_clock = FakeClock(0), FakeClock(5_000_000)  # wildly different clocks
    old = task_queue.StalenessObserver(TTL, old_observer_clock)
    old.observe(task_queue.read_lease(layout, SHARD))
    old_observer_clock.advance(TTL)
    assert old.is_stale(task_queue.read_lease(layout, SHARD))
    fresh = task_queue.StalenessObserver(TTL, new_clock)
    assert not fresh.is_stale(task_queue.read_lease(layout, SHARD))
    new_clock.advance(TTL / 2)
    assert not fresh.is_stale(task_queue.read_lease(layout, SHARD))
    new_clock.advance(TTL / 2)
    assert fresh.is_stale(task_queue.read_lease(layout, SHARD))


def test_claim_without_heartbeat_or_with_corrupt_claim_goes_stale_after_ttl(job, clock):
    layout = JobLayout(job)
    claim(layout, identity("holder"))
    layout.claim(SHARD, 1).write_bytes(b'{"format": "dj-elastic/claim", "vers')  # torn
    observer = task_queue.StalenessObserver(TTL, clock)
    view = task_queue.read_lease(layout, SHARD)
    assert view.claim is None and view.claim_error
    assert task_queue.takeover_reason(view, identity("me"), observer) is None
    clock.advance(TTL)
    assert (
        task_queue.takeover_reason(task_queue.read_lease(layout, SHARD), identity("me"), observer)
        == TakeoverReason.STALE
    )


def test_release_and_failure_records_make_a_generation_claimable_at_once(job, clock):
    layout = JobLayout(job)
    me = identity("me")
    observer = task_queue.StalenessObserver(TTL, clock)
    c1 = claim(layout, identity("a"))
    task_queue.release_claim(layout, c1, "signal")
    assert task_queue.takeover_reason(task_queue.read_lease(layout, SHARD), me, observer) == TakeoverReason.RELEASED
    c2 = claim(layout, me, TakeoverReason.RELEASED)
    assert c2.generation == 2
    failure = Failure(SHARD, 2, c2.attempt_id, "me", "h", 1, "boom", "E", "error", 0.0)
    layout.failure_dir(SHARD).mkdir(parents=True)
    assert fsio.publish_bytes(layout.failure(SHARD, 2), failure.encode())
    assert task_queue.takeover_reason(task_queue.read_lease(layout, SHARD), me, observer) == TakeoverReason.FAILED
    assert task_queue.release_claim(layout, c1, "signal"), "releasing twice is harmless"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_dead_pid_on_this_host_is_stale_immediately(job, clock):
    layout = JobLayout(job)
    me = identity("me")
    if not me.pid_namespace:
        pytest.skip("no /proc pid namespace information")
    dead = identity("me", pid=_dead_pid())
    claim(layout, dead)
    observer = task_queue.StalenessObserver(TTL, clock)
    assert task_queue.takeover_reason(task_queue.read_lease(layout, SHARD), me, observer) == TakeoverReason.HOLDER_DEAD


def test_dead_pid_in_another_kernel_or_namespace_waits_for_ttl(job, clock):
    layout = JobLayout(job)
    me = identity("me")
    claim(layout, identity("x", pid=_dead_pid(), boot_id="another-boot"))
    observer = task_queue.StalenessObserver(TTL, clock)
    assert task_queue.takeover_reason(task_queue.read_lease(layout, SHARD), me, observer) is None
    layout2 = JobLayout(job)
    other = "part-00001-of-00004"
    view = task_queue.read_lease(layout2, other)
    task_queue.publish_claim(layout2, view, identity("x", pid=_dead_pid(), pid_namespace="pid:[1]"), "att-1", "none")
    assert task_queue.takeover_reason(task_queue.read_lease(layout2, other), me, observer) is None


def test_live_same_host_pid_is_not_taken_over(job, clock):
    layout = JobLayout(job)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        claim(layout, identity("peer", pid=proc.pid))
        observer = task_queue.StalenessObserver(TTL, clock)
        assert task_queue.takeover_reason(task_queue.read_lease(layout, SHARD), identity("me"), observer) is None
    finally:
        proc.kill()
        proc.wait()


def test_latest_generation_probes_past_a_stale_listing(job, monkeypatch):
    layout = JobLayout(job)
    claim(layout, identity("a"))
    task_queue.release_claim(layout, task_queue.read_lease(layout, SHARD).claim, "finished")
    claim(layout, identity("b"), TakeoverReason.RELEASED)
    monkeypatch.setattr(fsio, "list_names", lambda path: ["gen-000001.json"])  # cached, outdated listing
    assert task_queue.latest_generation(layout, SHARD) == 2


def _race(args):
    job, node, shards, gen = args
    layout = JobLayout(job)
    me = identity(node)
    wins = []
    for shard in shards:
        view = task_queue.read_lease(layout, shard)
        while view.generation < gen - 1:  # wait until the previous generation is visible
            view = task_queue.read_lease(layout, shard)
        if view.generation != gen - 1:
            continue
        c = task_queue.publish_claim(layout, view, me, me.new_attempt_id(), "none")
        if c is not None:
            wins.append((shard, c.generation))
            if gen == 1:
                task_queue.release_claim(layout, c, "finished")
    return wins


@pytest.mark.parametrize("generation", [1, 2])
def test_claims_are_exclusive_across_racing_processes(tmp_path, generation):
    from data_juicer_elastic.shards.prepare import prepare_job

    from .conftest import make_rows, request, write_rows

    data = write_rows(tmp_path / "in.jsonl", make_rows(60))
    job = tmp_path / "job"
    prepare_job(request(job, data, 30))
    shards = [shard_id(i, 30) for i in range(30)]
    if generation == 2:  # everyone races to take over released generation-1 claims
        layout = JobLayout(job)
        for shard in shards:
            c = task_queue.publish_claim(layout, task_queue.read_lease(layout, shard), identity("first"), "a0", "none")
            task_queue.release_claim(layout, c, "finished")
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(6) as pool:
        results = pool.map(_race, [(job, f"node-{i}", shards, generation) for i in range(6)])
    wins = [w for r in results for w in r]
    assert sorted(s for s, _ in wins) == shards, "every shard won exactly once"
    layout = JobLayout(job)
    for shard in shards:
        assert [n for n in fsio.list_names(layout.claim_dir(shard)) if not n.startswith(".")] == [
            f"gen-{g:06d}.json" for g in range(1, generation + 1)
        ]


def test_heartbeater_renews_and_loses_on_newer_generation(job, clock):
    layout = JobLayout(job)
    c = claim(layout, identity("a"))
    hb = heartbeats.Heartbeater(layout, c, heartbeat_secs=10, ttl_secs=TTL, clock=clock)
    assert hb.beat() and hb.beat()
    assert task_queue.read_lease(layout, SHARD).heartbeat.seq == 2
    task_queue.release_claim(layout, c, "signal")
    claim(layout, identity("b"), TakeoverReason.RELEASED)
    assert not hb.beat() and hb.lost.is_set() and "newer generation" in hb.lost_reason


def test_heartbeater_self_fences_after_ttl_minus_two_heartbeats(job, clock):
    layout = JobLayout(job)
    c = claim(layout, identity("a"))
    hb = heartbeats.Heartbeater(layout, c, heartbeat_secs=10, ttl_secs=TTL, clock=clock)
    assert hb.beat()

    def failing(op, path):
        if op == "create" and "heartbeats" in str(path):
            raise OSError(28, "No space left on device", str(path))

    fault_seam.set_fault_hook(failing)
    try:
        clock.advance(TTL - 2 * 10 - 1)
        assert not hb.beat() and hb.check(), "still within the grace period"
        clock.advance(2)
        assert not hb.beat() and not hb.check() and hb.lost.is_set()
    finally:
        fault_seam.set_fault_hook(None)


def test_heartbeater_thread_keeps_the_seq_moving(job):
    layout = JobLayout(job)
    c = claim(layout, identity("a"))
    heartbeater = heartbeats.Heartbeater(layout, c, heartbeat_secs=0.02, ttl_secs=1.0)
    heartbeater.start()
    time.sleep(0.5)
    heartbeater.stop()
    seq = task_queue.read_lease(layout, SHARD).heartbeat.seq
    assert seq >= 3
    with pytest.raises(ValueError):
        heartbeats.Heartbeater(layout, c, heartbeat_secs=0.6, ttl_secs=1.0)
    assert isinstance(c, Claim)
