"""The streaming merge handed from follower to finalize: a complete, untouched prefix is published
without being read again, a stale one (a shard run again since) is rebuilt, a follower never writes
into a file another one published, and a failed job leaves no file at the export path."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.finalize import finalize
from data_juicer_elastic.jobdir.exports import export_stats_path
from data_juicer_elastic.jobdir.records import ShardResult
from data_juicer_elastic.jobdir.retry import retry_shards
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards import merge, merge_files
from data_juicer_elastic.shards.merge import (
    follow_merge,
    merge_job,
    partial_path,
    progress_path,
    read_progress,
    stats_partial_path,
)
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.shards.verify import verify_job

from ..rayfree import rayfree_runner
from .conftest import copy_runner, identity, make_rows, request, write_rows

LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=0.2, max_retries=0)


def _plain(job, tmp_path) -> bytes:
    merge_job(job, tmp_path / "plain-reference.jsonl")
    return (tmp_path / "plain-reference.jsonl").read_bytes()


def _with_row_stats(tmp_path):
    """A finished job whose rows carry stats (a Filter's output): each shard has a row stats file."""
    rows = [{**row, "__dj__stats__": {"len": len(row["text"])}} for row in make_rows(40)]
    job = tmp_path / "stats-job"
    prepare_job(request(job, write_rows(tmp_path / "stats-in.jsonl", rows), 4))
    assert run_worker(job, identity(), rayfree_runner(job), WorkerSettings(**LEASE)).complete
    return job


def test_a_complete_untouched_prefix_and_its_row_stats_are_published_without_being_read_again(tmp_path, monkeypatch):
    job = _with_row_stats(tmp_path)
    output = tmp_path / "merged.jsonl"
    assert follow_merge(job, output, wait=False, publish=False) is None  # a run's follower: every shard appended
    progress = read_progress(output)
    assert progress.shards_final == 4 and progress.stats_bytes_final > 0 and not output.exists()
    assert stats_partial_path(output).stat().st_size == progress.stats_bytes_final

    def no_reading(*args, **kwargs):
        raise AssertionError("a complete prefix, or a row stats file, was read again")

    for name in ("hash_prefix",):
        monkeypatch.setattr(merge_files, name, no_reading)
    for name in ("copy_shard", "stage_row_stats"):
        monkeypatch.setattr(merge, name, no_reading)
    monkeypatch.setattr(merge.attempts, "check_row_stats_file", no_reading)
    result = finalize(job, output, stream=True)
    monkeypatch.undo()
    plain = _plain(job, tmp_path)
    assert result.written and output.read_bytes() == plain
    assert export_stats_path(output).read_bytes() == export_stats_path(tmp_path / "plain-reference.jsonl").read_bytes()
    assert read_progress(output).complete and not partial_path(output).exists()
    assert not stats_partial_path(output).exists()
    finalize(job, output, stream=True)  # the published export again: merge.json back to it
    assert verify_job(job).export.files == 2


@pytest.mark.parametrize("edited", ["output", "row stats"])
def test_a_prefix_edited_after_its_record_is_read_again_and_rebuilt(tmp_path, edited):
    job = _with_row_stats(tmp_path)
    output = tmp_path / "merged.jsonl"
    follow_merge(job, output, wait=False, publish=False)
    time.sleep(0.05)  # a later write than the record's (timestamps may be coarse)
    path = partial_path(output) if edited == "output" else stats_partial_path(output)
    data = bytearray(path.read_bytes())
    data[5] ^= 0x01
    path.write_bytes(bytes(data))
    finalize(job, output, stream=True)
    assert output.read_bytes() == _plain(job, tmp_path)
    assert export_stats_path(output).read_bytes() == export_stats_path(tmp_path / "plain-reference.jsonl").read_bytes()


def test_a_shard_run_again_after_it_was_appended_is_not_trusted(job, tmp_path):
    output = tmp_path / "merged.jsonl"
    run_worker(job, identity(), copy_runner(), WorkerSettings(**LEASE))
    follow_merge(job, output, wait=False, publish=False)
    appended = read_progress(output).shards[1].attempt_id
    result = ShardResult.parse((job / "done" / "part-00001-of-00004.json").read_bytes(), "done")
    (job / result.output).write_text("")  # lost; requeued and run again by another attempt
    retry_shards(job, shard_ids=["part-00001-of-00004"])
    run_worker(job, identity(), copy_runner(lambda row: {**row, "again": True}), WorkerSettings(**LEASE))
    merged = finalize(job, output, stream=True)
    assert merged.rows == 40 and output.read_bytes() == _plain(job, tmp_path)
    assert b'"again": true' in output.read_bytes() and read_progress(output).shards[1].attempt_id != appended


HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys, time
    partial, export, go = sys.argv[1:4]
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    os.write(fd, b'{"published": true}\\n')
    print("locked", flush=True)
    while not os.path.exists(go):
        time.sleep(0.02)
    os.link(partial, export)  # published, then its .partial name removed, as follow_merge does
    os.unlink(partial)
    """
)


def test_a_follower_that_waited_for_the_lock_never_writes_into_the_published_file(job, tmp_path):
    output = tmp_path / "merged.jsonl"
    run_worker(job, identity(), copy_runner(), WorkerSettings(**LEASE))
    go = tmp_path / "go"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(partial_path(output)), str(output), str(go)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    waiting = dict(wait=False, lock_wait_secs=30, publish=False)  # a run's follower
    waiter = threading.Thread(target=follow_merge, args=(job, output), kwargs=waiting)
    waiter.start()
    time.sleep(0.5)  # the waiter opened the partial (the holder's inode) and waits for its lock
    go.write_text("")
    holder.wait(30)
    waiter.join(60)
    assert not waiter.is_alive()
    assert output.read_bytes() == b'{"published": true}\n', "the waiter truncated or wrote the published file"
    assert partial_path(output).exists(), "the waiter merged into a partial of its own"


def test_a_failed_job_leaves_a_resumable_partial_and_nothing_at_the_export_path(job, tmp_path):
    output = tmp_path / "merged.jsonl"

    def fail_third(task):
        if task.shard_id == "part-00002-of-00004":
            raise ValueError("poison row")
        return copy_runner()(task)

    run_worker(job, identity(), fail_third, WorkerSettings(**LEASE))
    with pytest.raises(ElasticError) as info:
        follow_merge(job, output, wait=True, poll_secs=0.05, publish=False)
    assert "part-00002-of-00004" in str(info.value)
    with pytest.raises(ElasticError):
        finalize(job, output, stream=True)
    assert not output.exists(), "nothing at the export path"
    progress = read_progress(output)
    assert progress_path(output).exists() and not progress.complete and progress.shards_final == 2


def test_a_follow_stopped_mid_job_with_torn_tails_resumes_to_the_plain_merge_and_its_row_stats(tmp_path):
    rows = [{**row, "__dj__stats__": {"len": len(row["text"])}} for row in make_rows(40)]
    job = tmp_path / "job"
    prepare_job(request(job, write_rows(tmp_path / "in.jsonl", rows), 4))
    runner = rayfree_runner(job)
    run_worker(job, identity(), runner, WorkerSettings(max_shards=2, wait_for_completion=False, **LEASE))
    output = tmp_path / "merged.jsonl"
    stop = threading.Event()
    follow_merge(job, output, poll_secs=0.05, stop=stop, publish=False, on_progress=lambda p: stop.set())
    assert read_progress(output).stats_bytes_final > 0
    for path in (partial_path(output), stats_partial_path(output)):  # a crash while appending the next shard
        with open(path, "ab") as torn:
            torn.write(b'{"half": "a ro')
    assert run_worker(job, identity(), runner, WorkerSettings(**LEASE)).complete
    finalize(job, output, stream=True)
    assert output.read_bytes() == _plain(job, tmp_path)
    assert export_stats_path(output).read_bytes() == export_stats_path(tmp_path / "plain-reference.jsonl").read_bytes()
