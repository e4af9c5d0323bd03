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
from data_juicer_elastic.jobdir.result_records import ShardResult
from data_juicer_elastic.jobdir.retry import retry_shards
from data_juicer_elastic.jobdir.worker_loop import run_worker
from data_juicer_elastic.shards import stream_merge
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.stream_merge import follow_merge, partial_path, progress_path, read_progress
from data_juicer_elastic.shards.verify import verify_job

from .conftest import copy_runner, identity

LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=0.2, max_retries=0)


def _plain(job, tmp_path) -> bytes:
    merge_job(job, tmp_path / "plain-reference.jsonl")
    return (tmp_path / "plain-reference.jsonl").read_bytes()


def test_a_complete_untouched_prefix_is_published_without_being_read_again(job, tmp_path, monkeypatch):
    output = tmp_path / "merged.jsonl"
    run_worker(job, identity(), copy_runner(), **LEASE)
    assert follow_merge(job, output, wait=False, publish=False) is None  # a run's follower: every shard appended
    assert read_progress(output).shards_final == 4 and not output.exists()

    def no_rehash(*args):
        raise AssertionError("the complete prefix was read again")

    monkeypatch.setattr(stream_merge, "_hash_prefix", no_rehash)
    monkeypatch.setattr(stream_merge, "copy_shard", no_rehash)
    result = finalize(job, output, stream=True)
    assert result.written and output.read_bytes() == _plain(job, tmp_path)
    assert read_progress(output).complete and not partial_path(output).exists()
    monkeypatch.undo()
    assert verify_job(job).export.layout == "file"


def test_a_prefix_edited_after_its_record_is_read_again_and_rebuilt(job, tmp_path):
    output = tmp_path / "merged.jsonl"
    run_worker(job, identity(), copy_runner(), **LEASE)
    follow_merge(job, output, wait=False, publish=False)
    time.sleep(0.05)  # a later write than the record's (timestamps may be coarse)
    data = bytearray(partial_path(output).read_bytes())
    data[5] ^= 0x01
    partial_path(output).write_bytes(bytes(data))
    finalize(job, output, stream=True)
    assert output.read_bytes() == _plain(job, tmp_path)


def test_a_shard_run_again_after_it_was_appended_is_not_trusted(job, tmp_path):
    output = tmp_path / "merged.jsonl"
    run_worker(job, identity(), copy_runner(), **LEASE)
    follow_merge(job, output, wait=False, publish=False)
    appended = read_progress(output).shards[1].attempt_id
    result = ShardResult.parse((job / "done" / "part-00001-of-00004.json").read_bytes(), "done")
    (job / result.output).write_text("")  # lost; requeued and run again by another attempt
    retry_shards(job, shard_ids=["part-00001-of-00004"])
    run_worker(job, identity(), copy_runner(lambda row: {**row, "again": True}), **LEASE)
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
    run_worker(job, identity(), copy_runner(), **LEASE)
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

    run_worker(job, identity(), fail_third, **LEASE)
    with pytest.raises(ElasticError) as info:
        follow_merge(job, output, wait=True, poll_secs=0.05, publish=False)
    assert "part-00002-of-00004" in str(info.value)
    with pytest.raises(ElasticError):
        finalize(job, output, stream=True)
    assert not output.exists(), "nothing at the export path"
    progress = read_progress(output)
    assert progress_path(output).exists() and not progress.complete and progress.shards_final == 2
