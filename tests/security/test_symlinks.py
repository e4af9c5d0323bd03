"""Symlinks planted in a job directory never make the plugin write outside it.

Each case plants one link pointing at a directory outside the job, runs the part of
the plugin that writes there, and checks that it stops with an UnsafePathError naming
the link and that the outside directory is still empty.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from data_juicer_elastic.errors import UnsafePathError
from data_juicer_elastic.jobdir import attempts, task_queue
from data_juicer_elastic.jobdir.layout import JobLayout, check_inside, ensure_dir
from data_juicer_elastic.jobdir.retry import retry_shards
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.merge import merge_job
from tests.jobdir.conftest import copy_runner, identity

SHARD = "part-00000-of-00004"
LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=0.05, max_retries=0)


def _plant(link: Path, outside: Path) -> None:
    """Replace ``link`` (a directory of the job, maybe missing) by a symlink to ``outside``."""
    if link.is_dir() and not link.is_symlink():
        for child in link.iterdir():
            child.unlink() if child.is_file() else None
        link.rmdir()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "outside"
    path.mkdir()
    return path


def _assert_untouched(outside: Path) -> None:
    written = list(outside.rglob("*"))
    assert not written, f"something was written outside the job directory: {written}"


@pytest.mark.parametrize(
    "link",
    ["attempts", "done", "claims", "heartbeats", f"claims/{SHARD}", f"attempts/{SHARD}", f"heartbeats/{SHARD}"],
)
def test_worker_refuses_links_out_of_the_job_dir(job, outside, link):
    _plant(job / link, outside)
    with pytest.raises(UnsafePathError) as info:
        run_worker(job, identity(), copy_runner(), WorkerSettings(wait_for_completion=False, **LEASE))
    assert "outside the job directory" in info.value.message and link.split("/")[0] in str(info.value)
    _assert_untouched(outside)


@pytest.mark.parametrize("link", [f"releases/{SHARD}", f"failures/{SHARD}", "failed"])
def test_failure_and_release_records_refuse_links(job, outside, link):
    _plant(job / link, outside)

    def boom(task):
        raise ValueError("shard fails")

    with pytest.raises(UnsafePathError):
        run_worker(job, identity(), boom, WorkerSettings(wait_for_completion=False, **LEASE))
    _assert_untouched(outside)


def test_retry_refuses_a_linked_history_dir(job, outside):
    layout = JobLayout(job)

    def boom(task):
        raise ValueError("shard fails")

    run_worker(job, identity(), boom, WorkerSettings(wait_for_completion=False, max_shards=1, **{**LEASE}))
    assert task_queue.read_terminal(layout, SHARD)[0] is not None
    _plant(job / "history" / SHARD, outside)
    with pytest.raises(UnsafePathError):
        retry_shards(job, [SHARD])
    _assert_untouched(outside)
    assert task_queue.read_terminal(layout, SHARD)[0] is not None, "nothing moved: the shard is still failed"


def test_merge_refuses_an_accepted_output_read_through_a_link(job, tmp_path, outside):
    run_worker(job, identity(), copy_runner(), WorkerSettings(wait_for_completion=False, **LEASE))
    layout = JobLayout(job)
    result, _ = attempts.read_done(layout, SHARD)
    attempt_dir = layout.attempt_dir(SHARD, result.attempt_id)
    # a copy of the accepted attempt outside, reached through a link in the job dir
    (outside / "output.jsonl").write_bytes((attempt_dir / "output.jsonl").read_bytes())
    (attempt_dir / "output.jsonl").unlink()
    (attempt_dir / "output.jsonl").symlink_to(outside / "output.jsonl")
    with pytest.raises(UnsafePathError):
        merge_job(job, tmp_path / "merged.jsonl")
    assert not (tmp_path / "merged.jsonl").exists()


def test_a_linked_job_dir_itself_and_links_within_it_are_fine(job, tmp_path):
    alias = tmp_path / "alias"
    alias.symlink_to(job, target_is_directory=True)  # e.g. a mount alias
    (job / "claims").rename(job / "claims-real")
    (job / "claims").symlink_to(job / "claims-real", target_is_directory=True)  # stays inside
    summary = run_worker(alias, identity(), copy_runner(), WorkerSettings(wait_for_completion=False, **LEASE))
    assert summary.complete


def test_check_inside_names_the_planted_link(job, outside):
    layout = JobLayout(job)
    _plant(job / "attempts", outside)
    with pytest.raises(UnsafePathError) as info:
        ensure_dir(layout, layout.attempt_dir(SHARD, "a1"))
    assert info.value.where == str(job / "attempts")
    with pytest.raises(UnsafePathError):
        check_inside(layout, job.parent / "elsewhere")
    _assert_untouched(outside)


def test_finalize_refuses_linked_merge_and_stats_destinations(job, tmp_path, outside):
    from data_juicer_elastic.stats import compute_overall, write_overall_stats

    run_worker(job, identity(), copy_runner(), WorkerSettings(wait_for_completion=False, **LEASE))
    overall = compute_overall(job)
    _plant(job / "stats", outside)
    with pytest.raises(UnsafePathError):
        write_overall_stats(overall, job)
    with pytest.raises(UnsafePathError):
        merge_job(job, tmp_path / "merged.jsonl")  # a top-level link is refused before any output
    _assert_untouched(outside)
    assert not (tmp_path / "merged.jsonl").exists()


def test_elections_refuse_a_linked_run_directory(job, outside):
    from data_juicer_elastic.coordination.run import RunCoordinator, resolve_run_id, run_key

    run = resolve_run_id("run-1")
    coordinator = RunCoordinator(JobLayout(job), run, identity(), ttl_secs=60, heartbeat_secs=10, poll_secs=1)
    _plant(job / "coordination" / run_key(run.value), outside)
    with pytest.raises(UnsafePathError):
        coordinator.join(1)
    _assert_untouched(outside)
