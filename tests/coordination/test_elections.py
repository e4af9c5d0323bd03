"""Elections (the prepare and finalize roles), outcomes and leader liveness, with real processes racing on link()."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time

import pytest

from data_juicer_elastic.coordination.run import Instance, Outcome, error_from_outcome
from data_juicer_elastic.errors import CoordinatorLostError, InputError, ShardFailedError

from ..jobdir.conftest import FakeClock, identity
from .conftest import coordinator


def _elect(job, node, phase, queue):
    c = coordinator(job, node)
    c.join()
    won, leader = c.elect(phase)
    queue.put((node, won, leader.node_id))


@pytest.mark.parametrize("phase", ["prepare", "finalize"])
def test_exactly_one_of_eight_processes_is_elected(tmp_path, phase):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_elect, args=(tmp_path, f"n{i}", phase, queue)) for i in range(8)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    winners = [node for node, won, _ in results if won]
    assert len(winners) == 1
    assert {leader for _, _, leader in results} == set(winners), "everyone sees the same leader"
    assert len(coordinator(tmp_path, "x").participants()) == 8


def test_runs_are_separate_generations(tmp_path):
    first, second = coordinator(tmp_path, "a", run="sub-1"), coordinator(tmp_path, "b", run="sub-2")
    first.join(), second.join()
    assert first.elect("finalize")[0] and second.elect("finalize")[0]
    first.abort("finalize", InputError("boom"))
    assert second.outcome() is None


def test_the_first_outcome_wins_and_every_reader_gets_the_same_error(tmp_path):
    a, b = coordinator(tmp_path, "a"), coordinator(tmp_path, "b")
    a.join(), b.join()
    first = a.abort("work", ShardFailedError("1 shard(s) failed terminally", where="/job", hint="retry"))
    second = b.abort("finalize", InputError("something else"))
    assert second == first
    ok = b.finalized({"rows": 1})
    assert not ok.ok and ok == first
    errors = [error_from_outcome(o) for o in (a.outcome(), b.outcome())]
    assert all(type(e) is ShardFailedError for e in errors)
    assert str(errors[0]) == str(errors[1]) == "/job: 1 shard(s) failed terminally (retry)"
    with pytest.raises(ShardFailedError):
        b.raise_if_aborted()


def test_unexpected_errors_are_published_with_their_type(tmp_path):
    c = coordinator(tmp_path, "a")
    c.join()
    outcome = c.abort("prepare", OSError(28, "No space left on device"))
    assert outcome.error_type == "ElasticError" and "OSError" in outcome.message
    assert error_from_outcome(outcome).exit_code == 2


def test_a_waiter_reports_a_leader_whose_process_is_gone_at_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leader = coordinator(tmp_path, "leader")
    leader.identity = identity("leader", pid=dead.pid)
    leader.instance = leader.instance.__class__(**{**leader.instance.__dict__, "pid": dead.pid})
    leader.join()
    assert leader.elect("finalize")[0]
    waiter = coordinator(tmp_path, "waiter")
    waiter.join()
    won, seen = waiter.elect("finalize")
    assert not won
    t0 = time.monotonic()
    with pytest.raises(CoordinatorLostError) as info:
        waiter.await_phase("finalize", seen, waiter.outcome)
    assert time.monotonic() - t0 < 2
    assert "exited before publishing" in str(info.value)
    assert waiter.outcome().phase == "finalize" and not waiter.outcome().ok


def test_a_waiter_keeps_waiting_while_the_leader_heartbeats_and_gives_up_after_ttl(tmp_path):
    clock = FakeClock()
    leader = coordinator(tmp_path, "leader")
    leader.join()
    leader.elect("prepare")
    beats = leader.role("prepare").heartbeater
    beats.beat()
    waiter = coordinator(tmp_path, "waiter", clock=clock)
    waiter.identity = identity("waiter", hostname="another-host")  # no same-host shortcut
    waiter.join()
    rounds = []

    def sleep(_):
        rounds.append(1)
        clock.advance(1.0)
        if len(rounds) < 10:
            beats.beat()  # alive: the value keeps changing

    waiter.sleep = sleep
    with pytest.raises(CoordinatorLostError) as info:
        waiter.await_phase("prepare", leader.leader("prepare"), waiter.prepare_result)
    assert len(rounds) == 9 + 3, "waited through 9 heartbeats, then one TTL (3s)"
    assert "stopped renewing its heartbeat for 3s" in str(info.value)


def test_waiters_return_the_published_result(tmp_path):
    leader, waiter = coordinator(tmp_path, "leader"), coordinator(tmp_path, "waiter")
    leader.join(), waiter.join()
    leader.elect("finalize")
    leader.finalized({"rows": 7})
    outcome = waiter.await_phase("finalize", waiter.leader("finalize"), waiter.outcome)
    assert isinstance(outcome, Outcome) and outcome.ok and outcome.details == {"rows": 7}
    assert isinstance(waiter.leader("finalize"), Instance) and waiter.leader("finalize") == leader.instance


def test_a_killed_leader_not_yet_reaped_by_its_parent_counts_as_gone(tmp_path):
    """A zombie still answers kill(0); the same-host shortcut must not wait a TTL for it."""
    import os
    import signal

    from data_juicer_elastic.sharedfs.identity import pid_alive

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(child.pid):
            assert time.monotonic() < deadline, "a zombie was reported alive"
            time.sleep(0.05)
    finally:
        child.wait()
