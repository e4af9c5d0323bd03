"""Claim-ahead (jobdir.claiming): lease semantics of the shard held while another runs. No Ray.

Every test runs real claims in a real job directory; "while the current shard runs" is a fake
runner that polls the job directory (never sleeps long) for what the helper thread did.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from data_juicer_elastic.jobdir import heartbeats, task_queue
from data_juicer_elastic.jobdir.claiming import ClaimAhead
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import ReleaseReason, TakeoverReason
from data_juicer_elastic.jobdir.task_queue import TaskQueue
from data_juicer_elastic.jobdir.worker import WorkerSettings, keeper_in_loop, run_worker

from .conftest import FakeClock, copy_runner, identity, run_victim

LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=1.0)
S = [f"part-0000{i}-of-00004" for i in range(4)]


def wait_for(condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def generation(layout: JobLayout, shard: str) -> int:
    return task_queue.read_lease(layout, shard).generation


def released(layout: JobLayout, shard: str, gen: int = 1):
    path = layout.release(shard, gen)
    return json.loads(path.read_text())["reason"] if path.exists() else None


def attempts_of(job: Path, shard: str) -> list[Path]:
    directory = job / "attempts" / shard
    return sorted(directory.iterdir()) if directory.exists() else []


def live_claims(layout: JobLayout) -> list[str]:
    """Shards whose latest generation is claimed and neither released, failed nor done."""
    live = []
    for shard in S:
        view = task_queue.read_lease(layout, shard)
        if view.generation and not view.ended and not layout.done(shard).exists():
            live.append(shard)
    return live


def runner(on_run, then=None, *, read_all=True):
    """A fake run_shard calling ``on_run(task)`` first, then copying the shard (or ``then``).

    ``read_all``: first report every row read and through the recipe, as the Ray runner's
    progress does: the shard is then in its tail (``worker.TAIL_FRACTION``), where
    claim-ahead starts."""
    copy = copy_runner()

    def run(task):
        if read_all:
            heartbeats.current().update(rows_read=task.input_rows, rows_written=task.input_rows)
        on_run(task)
        return (then or copy)(task)

    return run


def test_one_shard_is_claimed_ahead_while_each_runs_and_then_run(job):
    layout = JobLayout(job)
    seen = []

    def on_run(task):
        i = S.index(task.shard_id)
        if i + 1 < len(S):  # the next shard gets claimed while this one runs
            wait_for(lambda: generation(layout, S[i + 1]) == 1, what=f"{S[i + 1]} claimed ahead")
        seen.append((task.shard_id, live_claims(layout)))

    summary = run_worker(job, identity("solo"), runner(on_run), WorkerSettings(max_retries=1, **LEASE))
    assert summary.complete and (summary.claimed, summary.done, summary.unrun) == (4, 4, 0)
    for i, (shard, live) in enumerate(seen):
        assert shard == S[i] and live == S[i : i + 2], "at most one shard ahead of the running one"
    for shard in S:  # each shard: one claim, one attempt, released as finished
        assert generation(layout, shard) == 1 and len(attempts_of(job, shard)) == 1
        assert released(layout, shard) == ReleaseReason.FINISHED


def test_nothing_is_claimed_ahead_before_the_current_shard_is_in_its_tail(job):
    """While the current shard is short of its tail, the next shard stays free for other nodes;
    in the tail it is claimed ahead. First shard: by its rows through the recipe; later ones: by
    the time per row of the last shard (here 1 s for 10 rows: the tail starts after 0.8 s)."""
    layout = JobLayout(job)
    free_before_the_tail = []

    def on_run(task):
        tracker = heartbeats.current()
        tracker.update(rows_read=task.input_rows, rows_written=task.input_rows // 2)
        if task.shard_id == S[0]:
            time.sleep(1.0)  # five polls of the tail gate
            free_before_the_tail.append(generation(layout, S[1]))
            tracker.update(rows_written=task.input_rows)
            wait_for(lambda: generation(layout, S[1]) == 1, what=f"{S[1]} claimed ahead in the tail")
        elif task.shard_id == S[1]:
            time.sleep(0.4)  # half of the last shard's time
            free_before_the_tail.append(generation(layout, S[2]))
            wait_for(lambda: generation(layout, S[2]) == 1, what=f"{S[2]} claimed ahead once in the tail")

    summary = run_worker(job, identity("solo"), runner(on_run, read_all=False), WorkerSettings(max_retries=1, **LEASE))
    assert summary.complete and (summary.claimed, summary.done, summary.unrun) == (4, 4, 0)
    assert free_before_the_tail == [0, 0], "claimed ahead before the current shard's tail"


def test_the_shard_claimed_ahead_is_renewed_however_long_the_current_one_runs(job):
    """An observer's clock moves 0.9 TTL per renewal it sees: 8 TTLs of it pass, never stale."""
    layout = JobLayout(job)
    observer_clock = FakeClock()
    observer = task_queue.StalenessObserver(1.0, observer_clock)
    other = identity("other", boot_id="elsewhere")
    checks = []

    def on_run(task):
        if task.shard_id != S[0]:
            return
        wait_for(lambda: generation(layout, S[1]) == 1, what="the shard claimed ahead")
        last = None
        for _ in range(9):
            wait_for(lambda last=last: task_queue.read_lease(layout, S[1]).watch_token != last, what="a renewal")
            view = task_queue.read_lease(layout, S[1])
            last = view.watch_token
            checks.append(task_queue.takeover_reason(view, other, observer))
            observer_clock.advance(0.9)

    summary = run_worker(
        job,
        identity(),
        runner(on_run),
        WorkerSettings(max_retries=1, ttl_secs=1.0, heartbeat_secs=0.05, poll_interval_secs=0.1),
    )
    assert checks == [None] * 9, "the shard claimed ahead never looked free to another worker"
    assert summary.complete and summary.lost == 0 and summary.unrun == 0
    assert generation(layout, S[1]) == 1 and len(attempts_of(job, S[1])) == 1


def test_stop_event_releases_the_shard_claimed_ahead_at_once_uncounted(job):
    layout = JobLayout(job)
    stop = threading.Event()

    def on_run(task):
        wait_for(lambda: generation(layout, S[1]) == 1, what="the shard claimed ahead")
        stop.set()

    summary = run_worker(job, identity(), runner(on_run), WorkerSettings(max_retries=1, **LEASE), stop_event=stop)
    assert (summary.stop_reason, summary.claimed, summary.done, summary.unrun) == ("stopped", 1, 1, 1)
    assert released(layout, S[1]) == ReleaseReason.UNRUN
    assert attempts_of(job, S[1]) == [] and not (job / "failures").exists()
    # Another worker takes it at once: its observer's clock never moves, so no TTL could pass.
    other = run_worker(
        job,
        identity("other"),
        copy_runner(),
        WorkerSettings(max_retries=1, wait_for_completion=False, claim_ahead=False, **LEASE),
        clock=FakeClock(),
        drive_keeper=keeper_in_loop,
    )
    assert other.complete and other.claimed == 3
    assert task_queue.read_lease(layout, S[1]).claim.takeover_reason == TakeoverReason.RELEASED


@pytest.mark.parametrize("limit, value, claimed", [("max_shards", 1, 1), ("max_shards", 2, 2), ("max_done", 1, 1),
                                                   ("max_done", 2, 2)])  # fmt: skip
def test_limits_never_claim_a_shard_ahead_that_they_would_hand_back(job, limit, value, claimed):
    layout = JobLayout(job)
    summary = run_worker(job, identity(), copy_runner(), WorkerSettings(max_retries=1, **{limit: value}, **LEASE))
    assert (summary.claimed, summary.unrun, summary.stop_reason) == (claimed, 0, limit)
    assert [generation(layout, s) for s in S] == [1] * claimed + [0] * (4 - claimed)


def test_a_failing_shard_hands_the_one_ahead_back_and_is_retried_first(job):
    layout = JobLayout(job)
    runs = []

    def on_run(task):
        runs.append(task.shard_id)
        if runs == [S[0]]:
            wait_for(lambda: generation(layout, S[1]) == 1, what="the shard claimed ahead")
            raise ValueError("poison")

    summary = run_worker(job, identity(), runner(on_run), WorkerSettings(max_retries=1, **LEASE))
    assert released(layout, S[1]) == ReleaseReason.UNRUN
    assert runs[:2] == [S[0], S[0]], "the failed shard is retried first"
    assert summary.complete and (summary.claimed, summary.failed, summary.done, summary.unrun) == (5, 1, 4, 1)
    # the handed-back claim spent nothing: no failure record, one attempt (generation 2)
    assert not (job / "failures" / S[1]).exists() and len(attempts_of(job, S[1])) == 1
    assert generation(layout, S[1]) == 2


def test_losing_the_current_lease_hands_the_one_ahead_back(job):
    layout = JobLayout(job)

    def on_run(task):
        if task.shard_id == S[0]:
            wait_for(lambda: generation(layout, S[1]) == 1, what="the shard claimed ahead")
            view = task_queue.read_lease(layout, S[0])  # another worker takes the running shard over
            task_queue.publish_claim(layout, view, identity("other", boot_id="x"), "other-1", TakeoverReason.STALE)

    summary = run_worker(
        job, identity(), runner(on_run), WorkerSettings(max_retries=1, wait_for_completion=False, **LEASE)
    )
    assert summary.lost == 1 and released(layout, S[1]) == ReleaseReason.UNRUN and summary.unrun == 1
    assert summary.done == 3 and len(attempts_of(job, S[1])) == 1  # then claimed again and run


def test_a_shard_ahead_whose_lease_was_lost_is_not_run(job):
    layout = JobLayout(job)

    def on_run(task):
        if task.shard_id == S[0]:
            wait_for(lambda: generation(layout, S[1]) == 1, what="the shard claimed ahead")
            view = task_queue.read_lease(layout, S[1])
            task_queue.publish_claim(layout, view, identity("other", boot_id="x"), "other-1", TakeoverReason.STALE)

    summary = run_worker(
        job, identity(), runner(on_run), WorkerSettings(max_retries=1, wait_for_completion=False, **LEASE)
    )
    assert summary.unrun == 1 and summary.claimed == 3 and summary.lost == 0
    assert attempts_of(job, S[1]) == [] and generation(layout, S[1]) == 2


def test_off_claims_nothing_ahead(job):
    layout = JobLayout(job)
    seen = []
    summary = run_worker(
        job,
        identity(),
        runner(lambda task: seen.append(live_claims(layout))),
        WorkerSettings(max_retries=1, claim_ahead=False, **LEASE),
    )
    assert summary.complete and seen == [[s] for s in S]


def test_read_ahead_gets_the_checked_file_and_a_change_after_it_is_still_caught(job):
    layout = JobLayout(job)
    reads, got = [], {}
    shard1 = job / "shards" / f"{S[1]}.jsonl"

    def read_ahead(source):
        reads.append(Path(source.copy))
        return f"tables of {Path(source.copy).name}"

    def on_run(task):
        got[task.shard_id] = task.read_ahead
        if task.shard_id == S[0]:
            wait_for(lambda: reads, what="the read ahead")
            shard1.write_bytes(shard1.read_bytes() + b'{"id": -1}\n')  # changed after its check

    summary = run_worker(job, identity(), runner(on_run), WorkerSettings(max_retries=0, **LEASE), read_ahead=read_ahead)
    # S[1] failed its own check before anything was claimed ahead; S[3] was read while S[2] ran
    assert reads == [layout.shard(s, ".jsonl") for s in (S[1], S[3])]
    # what was read reaches the shard's run; S[1], changed after its read, was checked again and failed
    assert got == {S[0]: None, S[2]: None, S[3]: f"tables of {S[3]}.jsonl"}
    assert [shard for shard, _ in summary.terminal_failures] == [S[1]]
    assert "input shard is corrupt" in summary.terminal_failures[0][1]


def test_a_release_racing_the_helpers_claim_is_released_by_the_helper(job):
    layout = JobLayout(job)
    manifest = load_manifest(job)
    me = identity()
    go = threading.Event()

    def claim_next():
        go.wait(10)
        claim = task_queue.publish_claim(
            layout, task_queue.read_lease(layout, S[2]), me, me.new_attempt_id(), TakeoverReason.FIRST
        )
        return (manifest.shard(S[2]), claim), False

    ahead = ClaimAhead(TaskQueue(layout, identity(), ttl_secs=1.0, heartbeat_secs=0.05), manifest, claim_next)
    assert ahead.start() and not ahead.start(), "one cycle at a time"
    ahead.release(why="stopping")  # while the helper is still claiming
    go.set()
    assert ahead.take() is None
    assert released(layout, S[2]) == ReleaseReason.UNRUN and ahead.unrun == 1
    assert not layout.heartbeat(S[2], 1).exists(), "never renewed once given up"


# In its tail (every row through the recipe) the next shard is claimed ahead; once it is, SIGTERM.
CLAIMED_AHEAD = """\
    heartbeats.current().update(rows_read=task.input_rows, rows_written=task.input_rows)
    deadline = time.monotonic() + 20
    while task_queue.read_lease(layout, "part-00001-of-00004").generation == 0 and time.monotonic() < deadline:
        time.sleep(0.01)"""


def test_sigterm_releases_the_running_shard_and_the_one_ahead(job, tmp_path):
    run_victim(job, tmp_path, CLAIMED_AHEAD)
    layout = JobLayout(job)
    assert (released(layout, S[0]), released(layout, S[1])) == ("signal", "signal")
    assert attempts_of(job, S[1]) == []
    summary = run_worker(
        job,
        identity("next"),
        copy_runner(),
        WorkerSettings(max_retries=1, wait_for_completion=False, **LEASE),
        clock=FakeClock(),
        drive_keeper=keeper_in_loop,
    )
    assert summary.complete, "both taken over at once, without a TTL"


def test_sigint_releases_the_one_ahead_too(job):
    layout = JobLayout(job)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def on_run(task):
        wait_for(lambda: generation(layout, S[1]) == 1, what="the shard claimed ahead")
        signal.raise_signal(signal.SIGINT)

    try:
        with pytest.raises(KeyboardInterrupt):
            run_worker(job, identity(), runner(on_run), WorkerSettings(max_retries=1, **LEASE))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (released(layout, S[0]), released(layout, S[1])) == ("signal", "signal")
    assert not (job / "failures").exists()
