from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
from pathlib import Path

import pytest

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import attempts, heartbeats, task_queue
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import AttemptRecord, Failure, TakeoverReason
from data_juicer_elastic.jobdir.worker import WorkerSettings, keeper_in_loop, run_worker
from data_juicer_elastic.shards.merge import merge_job

from .conftest import copy_runner, identity, run_victim

LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=1.0)


def _input_rows(job: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((job / "shards").iterdir()) for line in p.open()]


def test_one_worker_completes_the_job(job, tmp_path):
    summary = run_worker(job, identity("solo"), copy_runner(), WorkerSettings(max_retries=1, **LEASE))
    assert (summary.claimed, summary.done, summary.failed, summary.complete) == (4, 4, 0, True)
    assert summary.stop_reason == "finished" and summary.terminal_failures == []
    merge_job(job, tmp_path / "out.jsonl")
    assert [json.loads(line) for line in (tmp_path / "out.jsonl").open()] == _input_rows(job)
    for shard in load_manifest(job).shard_ids:
        (attempt,) = (job / "attempts" / shard).iterdir()
        record = AttemptRecord.parse((attempt / "attempt.json").read_bytes(), "a")
        assert record.exit_reason == "done" and record.ended_at is not None
        assert (job / "releases" / shard / "gen-000001.json").exists()


def test_always_failing_shard_spends_its_budget_then_is_terminal(job):
    bad = "part-00002-of-00004"

    def run(task):
        if task.shard_id == bad:
            raise RuntimeError("Traceback (most recent call last):\n  ...\nValueError: row 23 is poison")
        return copy_runner()(task)

    summary = run_worker(job, identity(), run, WorkerSettings(max_retries=2, **LEASE))
    assert summary.done == 3 and summary.failed == 3 and summary.claimed == 6
    assert not summary.complete and summary.terminal_failures == [(bad, "ValueError: row 23 is poison")]
    assert len(list((job / "failures" / bad).iterdir())) == 3
    assert (job / "failed" / f"{bad}.json").exists()


def test_transient_failure_is_retried(job):
    calls = []

    def run(task):
        calls.append(task.shard_id)
        if calls.count(task.shard_id) == 1 and task.shard_id.startswith("part-00000"):
            raise OSError("flaky network")
        return copy_runner()(task)

    summary = run_worker(job, identity(), run, WorkerSettings(max_retries=1, **LEASE))
    assert summary.complete and summary.failed == 1 and summary.done == 4
    failure = Failure.parse((job / "failures" / "part-00000-of-00004" / "gen-000001.json").read_bytes(), "f")
    assert failure.error == "flaky network" and failure.error_type == "OSError"


def test_max_shards_counts_claims(job):
    def fail(task):
        raise ValueError("no")

    summary = run_worker(job, identity(), fail, WorkerSettings(max_retries=5, max_shards=2, **LEASE))
    assert summary.claimed == 2 and summary.stop_reason == "max_shards"


def test_waits_for_a_stale_claim_then_takes_it_over(job, clock):
    layout = JobLayout(job)
    ghost = identity("ghost", boot_id="elsewhere")
    held = "part-00000-of-00004"
    c = task_queue.publish_claim(
        layout, task_queue.read_lease(layout, held), ghost, "ghost-attempt", TakeoverReason.FIRST
    )
    heartbeats.write_heartbeat(layout, c, 1)
    sleeps = []

    def sleep(secs):
        sleeps.append(secs)
        clock.advance(secs)

    summary = run_worker(
        job,
        identity("rescuer"),
        copy_runner(),
        WorkerSettings(max_retries=3, **LEASE),
        clock=clock,
        drive_keeper=keeper_in_loop,
        sleep=sleep,
    )
    assert summary.complete and summary.claimed == 4
    assert sum(sleeps) >= LEASE["ttl_secs"], "no takeover before a full TTL on our clock"
    view = task_queue.read_lease(layout, held)
    assert view.generation == 2 and view.claim.takeover_reason == TakeoverReason.STALE
    failure = Failure.parse(layout.failure(held, 1).read_bytes(), "f")
    assert failure.exit_reason == "lease-expired" and failure.attempt_id == "ghost-attempt"


def test_without_waiting_a_held_shard_ends_the_worker(job):
    layout = JobLayout(job)
    held = "part-00003-of-00004"
    c = task_queue.publish_claim(
        layout, task_queue.read_lease(layout, held), identity("peer", boot_id="x"), "p1", "none"
    )
    heartbeats.write_heartbeat(layout, c, 1)
    summary = run_worker(
        job, identity(), copy_runner(), WorkerSettings(max_retries=1, wait_for_completion=False, **LEASE)
    )
    assert summary.done == 3 and summary.stop_reason == "no_work" and not summary.complete


def test_lost_lease_abandons_without_publishing(job):
    layout = JobLayout(job)

    def run(task):
        if task.shard_id == "part-00000-of-00004":
            # Another worker takes over while we run (we looked stale to it).
            view = task_queue.read_lease(layout, task.shard_id)
            task_queue.publish_claim(layout, view, identity("other", boot_id="x"), "other-1", TakeoverReason.STALE)
        return copy_runner()(task)

    summary = run_worker(job, identity(), run, WorkerSettings(max_retries=1, wait_for_completion=False, **LEASE))
    assert summary.lost == 1 and summary.done == 3
    assert not layout.done("part-00000-of-00004").exists()
    (attempt,) = (job / "attempts" / "part-00000-of-00004").iterdir()
    assert AttemptRecord.parse((attempt / "attempt.json").read_bytes(), "a").exit_reason == "lost"


def test_result_published_by_another_attempt_meanwhile_is_discarded(job):
    layout = JobLayout(job)

    def run(task):
        out = copy_runner()(task)
        if task.shard_id == "part-00001-of-00004":
            # a zombie of an older generation publishes first
            zombie = layout.claim(task.shard_id, 1)
            claim = task_queue.read_lease(layout, task.shard_id).claim
            other = type(claim)(**{**claim.__dict__, "attempt_id": "zombie-1"})
            zdir = layout.attempt_dir(task.shard_id, "zombie-1")
            zdir.mkdir(parents=True)
            (zdir / "output.jsonl").write_bytes(out.output_path.read_bytes())
            entry = load_manifest(layout.root).shard(task.shard_id)
            assert zombie.exists()
            attempts.publish_done(
                layout, other, zdir / "output.jsonl", input_rows=entry.rows, input_sha256=entry.sha256
            )
        return out

    summary = run_worker(job, identity(), run, WorkerSettings(max_retries=1, **LEASE))
    assert summary.discarded == 1 and summary.done == 3 and summary.complete
    assert attempts.read_done(layout, "part-00001-of-00004")[0].attempt_id == "zombie-1"


def test_corrupt_input_shard_is_a_failed_attempt(job):
    shard = job / "shards" / "part-00001-of-00004.jsonl"
    shard.write_bytes(shard.read_bytes().replace(b"row", b"wor", 1))
    summary = run_worker(job, identity(), copy_runner(), WorkerSettings(max_retries=1, **LEASE))
    assert summary.terminal_failures[0][0] == "part-00001-of-00004"
    assert "input shard is corrupt" in summary.terminal_failures[0][1]


def test_corrupt_manifest_is_refused_before_claiming(job):
    manifest = job / "manifest.json"
    obj = json.loads(manifest.read_bytes())
    del obj["shards"][0]["sha256"]
    manifest.write_text(json.dumps(obj))
    with pytest.raises(JobDirError, match="sha256"):
        run_worker(job, identity(), copy_runner(), WorkerSettings(max_retries=1, **LEASE))
    assert not list((job / "claims").iterdir())


def test_stop_event_stops_between_shards(job):
    stop = threading.Event()

    def run(task):
        stop.set()
        return copy_runner()(task)

    summary = run_worker(job, identity(), run, WorkerSettings(max_retries=1, **LEASE), stop_event=stop)
    assert summary.claimed == 1 and summary.done == 1 and summary.stop_reason == "stopped"


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handling for the test, whatever the parent did: a parent that ignores
    SIGINT (a background job of a non-interactive shell, nohup, some CI runners) passes SIG_IGN
    on, and then no SIGINT reaches the code under test."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_sigint_while_running_releases_then_raises_keyboard_interrupt(job, python_sigint):
    before = signal.getsignal(signal.SIGINT)

    def run(task):
        signal.raise_signal(signal.SIGINT)
        raise AssertionError("not reached")

    with pytest.raises(KeyboardInterrupt):
        run_worker(job, identity(), run, WorkerSettings(max_retries=1, **LEASE))
    assert signal.getsignal(signal.SIGINT) is before
    layout = JobLayout(job)
    view = task_queue.read_lease(layout, "part-00000-of-00004")
    assert view.release is not None and view.release.reason == "signal"
    assert not (job / "failures").exists() or not list((job / "failures").iterdir())


def test_sigterm_while_running_releases_and_dies_by_the_signal(job, tmp_path):
    run_victim(job, tmp_path)
    view = task_queue.read_lease(JobLayout(job), "part-00000-of-00004")
    assert view.release is not None and view.release.reason == "signal"
    # released: the next worker takes it at once, no TTL wait
    summary = run_worker(
        job, identity("next"), copy_runner(), WorkerSettings(max_retries=1, wait_for_completion=False, **LEASE)
    )
    assert summary.complete


def _worker_process(job):
    summary = run_worker(
        job,
        identity(f"node-{os.getpid()}"),
        copy_runner(),
        WorkerSettings(ttl_secs=30, heartbeat_secs=5, max_retries=1, poll_interval_secs=0.05),
    )
    return summary.done


def test_concurrent_worker_processes_do_each_shard_exactly_once(tmp_path):
    from data_juicer_elastic.shards.prepare import prepare_job

    from .conftest import make_rows, request, write_rows

    data = write_rows(tmp_path / "in.jsonl", make_rows(120))
    job = tmp_path / "job"
    prepare_job(request(job, data, 24))
    with multiprocessing.get_context("fork").Pool(4) as pool:
        done = pool.map(_worker_process, [job] * 4)
    assert sum(done) == 24
    for shard in load_manifest(job).shard_ids:
        assert len(list((job / "attempts" / shard).iterdir())) == 1
    merge_job(job, tmp_path / "out.jsonl")
    assert [json.loads(line)["id"] for line in (tmp_path / "out.jsonl").open()] == list(range(120))


@pytest.mark.parametrize(
    "op, name_part",
    [("create", ".result.json"), ("fsync", "output.jsonl"), ("link", "/done/"), ("makedirs", "attempts")],
)
def test_storage_errors_are_failed_attempts_naming_the_path(job, op, name_part):
    from data_juicer_elastic.sharedfs import fault_seam

    def hook(what, path):
        if what == op and name_part in str(path) and "part-00000-of-00004" in str(path):
            raise OSError(28, "No space left on device", str(path))

    fault_seam.set_fault_hook(hook)
    try:
        summary = run_worker(job, identity(), copy_runner(), WorkerSettings(max_retries=0, **LEASE))
    finally:
        fault_seam.set_fault_hook(None)
    layout = JobLayout(job)
    assert not layout.done("part-00000-of-00004").exists()
    assert summary.done == 3 and summary.failed == 1
    ((shard, error),) = summary.terminal_failures
    assert shard == "part-00000-of-00004" and "No space left" in error and name_part in error
    assert task_queue.read_lease(layout, shard).release is not None


@pytest.mark.parametrize(
    "bad",
    [dict(ttl_secs=10, heartbeat_secs=5), dict(ttl_secs=0), dict(max_retries=-1), dict(poll_interval_secs=0),
     dict(max_done=0), dict(max_shards=0), dict(max_holder_deaths=-1), dict(stall_timeout_secs=0)],
)  # fmt: skip
def test_bad_lease_settings_are_config_errors(job, bad):
    from data_juicer_elastic.errors import ConfigError

    kwargs = {**LEASE, "max_retries": 1, **bad}
    with pytest.raises(ConfigError):
        run_worker(job, identity(), copy_runner(), WorkerSettings(**kwargs))


def test_worker_fault_releases_the_claim_without_spending_the_budget(job):
    from data_juicer_elastic.errors import StageIdentityMismatch

    def run(task):
        raise StageIdentityMismatch("stage 0 differs", where=f"shard {task.shard_id}")

    with pytest.raises(StageIdentityMismatch):
        run_worker(job, identity("wrong-code"), run, WorkerSettings(max_retries=0, **LEASE))
    shard = "part-00000-of-00004"
    assert not (job / "failures" / shard).exists() or not list((job / "failures" / shard).iterdir())
    assert not (job / "failed" / f"{shard}.json").exists()
    assert (job / "releases" / shard / "gen-000001.json").exists()
    # A correctly set-up worker takes the shard over at once and finishes the job.
    summary = run_worker(job, identity("right-code"), copy_runner(), WorkerSettings(max_retries=0, **LEASE))
    assert summary.complete and summary.done == 4
