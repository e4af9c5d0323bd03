"""The stall rule and the death budget on injected clocks and a
fake runner: a heartbeat is renewed only while the attempt shows signs of life; a stalled
attempt is given up at once (failure ``stalled`` + release) and its runner told; holder
deaths and execution failures are counted apart."""

from __future__ import annotations

import random
import threading

import pytest

from data_juicer_elastic.jobdir import claiming, heartbeats, task_queue
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import Failure, TakeoverReason
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker

from .conftest import copy_runner, identity

SHARD = "part-00000-of-00004"


def test_signs_of_life_only_count_while_armed(clock):
    alive = heartbeats.Liveness(10.0, clock)
    clock.advance(100)
    assert not alive.is_stalled(), "not armed: publishing and claiming are not the runtime's"
    with alive.armed():
        clock.advance(10)
        assert not alive.is_stalled()
        clock.advance(0.5)
        assert alive.is_stalled() and "no sign of life for 10s" in alive.describe()
        alive.note("rows out")
        assert not alive.is_stalled()
    clock.advance(1000)
    assert not alive.is_stalled()


@pytest.mark.parametrize("seed", range(20))
def test_renewal_stops_exactly_when_the_quiet_period_exceeds_the_timeout(job, clock, seed):
    """Random traces of signs of life: the holder renews at a beat iff the attempt was quiet
    for at most the stall timeout; the first beat after that gives the shard up, once."""
    rng = random.Random(seed)
    layout = JobLayout(job)
    me = identity("me")
    claim = task_queue.publish_claim(
        layout, task_queue.read_lease(layout, SHARD), me, me.new_attempt_id(), TakeoverReason.FIRST
    )
    stall, given_up, restarted = 8.0, [], []
    alive = heartbeats.Liveness(stall, clock)
    alive.when_stalled(lambda: restarted.append(clock.now))
    beats = heartbeats.Heartbeater(
        layout, claim, heartbeat_secs=1.0, ttl_secs=30.0, clock=clock, liveness=alive, on_stall=given_up.append
    )
    last_sign = clock.now
    with alive.armed():
        for _ in range(60):
            clock.advance(1.0)
            if rng.random() < 0.15:
                alive.note("progress")
                last_sign = clock.now
            renewed = beats.beat()
            quiet = clock.now - last_sign
            if quiet <= stall:
                assert renewed, (quiet, stall)
            else:
                assert not renewed and beats.lost.is_set()
                break
    if beats.lost.is_set():
        assert len(given_up) == 1 and given_up[0].startswith("stalled: no sign of life") and restarted == [clock.now]
        assert not beats.beat() and len(given_up) == 1, "given up once"
    else:
        assert given_up == [] and restarted == []


def _stalling_runner(proceed: threading.Event):
    """A runner whose attempt stops showing life until its stall callback 'restarts' it."""

    def run(task):
        alive = heartbeats.current().liveness
        alive.when_stalled(proceed.set)
        if not proceed.wait(30):
            raise AssertionError("the stall was never declared")
        raise RuntimeError("runtime restarted under the attempt")

    return run


def test_a_stalled_attempt_is_given_up_as_a_death_and_the_shard_runs_again(job):
    proceed = threading.Event()
    stalled = run_worker(
        job,
        identity("stuck"),
        _stalling_runner(proceed),
        WorkerSettings(
            ttl_secs=3.0,
            heartbeat_secs=0.1,
            max_retries=0,
            poll_interval_secs=0.05,
            max_shards=1,
            stall_timeout_secs=0.3,
            max_holder_deaths=5,
        ),
    )
    assert stalled.lost == 1 and stalled.failed == 0
    layout = JobLayout(job)
    (failure,) = task_queue.list_failures(layout, SHARD)
    assert failure.exit_reason == "stalled" and failure.error_type == "ShardStalled"
    assert task_queue.read_lease(layout, SHARD).release.reason == "stalled", "released at once, not left to expire"
    # max_retries=0 does not apply to a death: the next worker takes the shard at once and finishes the job
    summary = run_worker(
        job,
        identity("next"),
        copy_runner(),
        WorkerSettings(
            ttl_secs=60.0,
            heartbeat_secs=10.0,
            max_retries=0,
            poll_interval_secs=0.05,
            wait_for_completion=False,
            stall_timeout_secs=30.0,
            max_holder_deaths=5,
        ),
    )
    assert summary.complete and summary.done == 4


def _failure(generation: int, reason: str) -> Failure:
    return Failure(SHARD, generation, f"a{generation}", "n", "h", 1, "boom", "E", reason, 0.0)


@pytest.mark.parametrize("seed", range(30))
def test_deaths_and_execution_failures_have_budgets_of_their_own(job, seed):
    rng = random.Random(seed)
    layout = JobLayout(job)
    max_retries, max_deaths = rng.randrange(4), rng.randrange(6)
    reasons = [rng.choice(["error", "lease-expired", "holder-dead", "stalled"]) for _ in range(12)]
    for generation, reason in enumerate(reasons, 1):
        errors = sum(r == "error" for r in reasons[:generation])
        deaths = generation - errors
        outcome = task_queue.record_failure(
            layout, None, shard_id=SHARD, generation=generation, error="boom", error_type="E", exit_reason=reason,
            max_retries=max_retries, reporter=identity(), max_holder_deaths=max_deaths,
        )  # fmt: skip
        exhausted = errors > max_retries or deaths > max_deaths
        assert (outcome.terminal is not None) == exhausted, (reasons[:generation], max_retries, max_deaths)
        if exhausted:
            assert outcome.terminal.max_holder_deaths == max_deaths
            break
    unlimited = task_queue.publish_terminal_if_exhausted(
        layout, "part-00001-of-00004", 0, [_failure(g, "holder-dead") for g in range(1, 50)], None
    )
    assert unlimited is None, "without a death budget, deaths never fail a shard"


def test_before_claim_runs_before_any_claim_is_held(job):
    seen: list[list[str]] = []

    def ready() -> bool:
        seen.append(sorted(p.name for p in (job / "claims").iterdir()))
        return len(seen) == 1  # the first call "took time": the shard is looked at afresh

    summary = run_worker(
        job,
        identity(),
        copy_runner(),
        WorkerSettings(
            ttl_secs=60.0, heartbeat_secs=10.0, max_retries=0, poll_interval_secs=0.05, wait_for_completion=False
        ),
        before_claim=ready,
    )
    assert summary.complete and summary.done == 4
    assert seen[0] == [] and len(seen) >= 4, "readiness is checked before each claim, the first before any"


def test_workers_joining_a_job_under_way_start_at_a_random_shard_only_when_asked(job):
    layout, manifest = JobLayout(job), load_manifest(job)

    def start(seed: int, random_start: bool) -> int:
        claimer = claiming.Claimer(
            task_queue.TaskQueue(layout, identity(), ttl_secs=60.0), manifest,
            rng=random.Random(seed), random_start=random_start,
        )  # fmt: skip
        return claimer.cursor.position

    assert {start(seed, False) for seed in range(20)} == {0}, "one worker alone claims in manifest order"
    assert {start(seed, True) for seed in range(20)} == {0}, "the first worker of a job starts at the first shard"
    first = claiming.Claimer(task_queue.TaskQueue(layout, identity(), ttl_secs=60.0), manifest)
    claimed, _ = first.claim_next()
    assert claimed is not None  # now the job is under way: a joining worker starts at random
    assert len({start(seed, True) for seed in range(20)}) > 1
    assert {start(seed, False) for seed in range(20)} == {0}
