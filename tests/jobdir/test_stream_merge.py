"""Streaming ordered merge: the final prefix grows as shards complete in order, a consumer can read
it early, a crash resumes, and the published file equals the non-streaming merge."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from data_juicer_elastic.errors import IntegrityError, JobDirError, MergeBusyError
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.merge import (
    follow_merge,
    merge_job,
    partial_path,
    progress_path,
    read_progress,
)
from data_juicer_elastic.sharedfs import fsio

from .conftest import copy_runner, identity

LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=0.2, max_retries=0)


def _run_one(job, shard_index: int) -> None:
    """Complete exactly one shard (the worker claims in manifest order unless we skip ahead)."""

    def runner(task):
        assert task.shard_id.startswith(f"part-{shard_index:05d}"), task.shard_id
        return copy_runner()(task)

    run_worker(job, identity(), runner, WorkerSettings(max_shards=1, wait_for_completion=False, **LEASE))


def _consumer_view(output):
    """What a downstream reader may use right now: the final prefix named by the progress record."""
    progress = read_progress(output)
    if progress is None:
        return None, b""
    if progress.complete:
        return progress, output.read_bytes()
    with open(partial_path(output), "rb") as handle:
        return progress, handle.read(progress.bytes_final)


def test_prefix_grows_in_order_and_the_final_file_equals_merge_job(job, tmp_path):
    output = tmp_path / "out" / "merged.jsonl"
    seen = []
    stop = threading.Event()
    result = {}
    follower = threading.Thread(
        target=lambda: result.update(
            r=follow_merge(job, output, poll_secs=0.05, stop=stop, on_progress=lambda p: seen.append(p))
        )
    )
    follower.start()
    try:
        _run_one(job, 0)
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        progress, prefix = _consumer_view(output)
        assert progress.shards_final == 1 and not progress.complete
        assert prefix == b"".join(json.dumps(r).encode() + b"\n" for r in _first_rows(job, 1))
        assert prefix.endswith(b"\n") and len(prefix) == progress.bytes_final
        for k in range(1, 4):
            _run_one(job, k)
        follower.join(30)
        assert not follower.is_alive()
    finally:
        stop.set()
        follower.join(5)
    streamed = output.read_bytes()
    assert [p.shards_final for p in seen] == [1, 2, 3, 4, 4] and seen[-1].complete
    assert [p.bytes_final for p in seen] == sorted(p.bytes_final for p in seen)
    assert not partial_path(output).exists()
    assert result["r"].sha256 == read_progress(output).prefix_sha256
    again = merge_job(job, tmp_path / "plain.jsonl")
    assert (tmp_path / "plain.jsonl").read_bytes() == streamed and again.sha256 == result["r"].sha256


def _first_rows(job, shards):
    from data_juicer_elastic.jobdir.manifest import load_manifest

    manifest = load_manifest(job)
    return [
        json.loads(line) for e in manifest.shards[:shards] for line in (job / "shards" / f"{e.shard_id}.jsonl").open()
    ]


def test_a_crash_mid_shard_resumes_from_the_final_prefix(job, tmp_path):
    output = tmp_path / "merged.jsonl"
    for k in range(2):
        _run_one(job, k)
    stop = threading.Event()
    follow_merge(job, output, poll_secs=0.05, stop=stop, on_progress=lambda p: stop.set())  # one shard, then stop
    assert read_progress(output).shards_final in (1, 2)
    final = read_progress(output).bytes_final
    with open(partial_path(output), "ab") as torn:  # a crash while appending the next shard
        torn.write(b'{"half": "a ro')
    for k in range(2, 4):
        _run_one(job, k)
    result = follow_merge(job, output, wait=False)
    assert output.read_bytes() == _plain(job, tmp_path)
    assert result.written and result.rows == 40 and final > 0


def test_a_corrupt_prefix_is_rebuilt_not_trusted(job, tmp_path):
    output = tmp_path / "merged.jsonl"
    run_worker(job, identity(), copy_runner(), WorkerSettings(**LEASE))
    stop = threading.Event()
    follow_merge(job, output, poll_secs=0.05, stop=stop, publish=False)
    data = bytearray(partial_path(output).read_bytes())
    data[3] ^= 0x20  # flip one byte inside the final prefix
    partial_path(output).write_bytes(bytes(data))
    follow_merge(job, output, wait=False)
    assert output.read_bytes() == _plain(job, tmp_path)


def _plain(job, tmp_path):
    merge_job(job, tmp_path / "plain-reference.jsonl")
    return (tmp_path / "plain-reference.jsonl").read_bytes()


def test_one_writer_per_partial_and_incomplete_jobs_fail_like_merge(job, tmp_path):
    output = tmp_path / "merged.jsonl"
    _run_one(job, 0)
    with pytest.raises(JobDirError, match="not complete") as info:
        follow_merge(job, output, wait=False)
    assert "part-00001-of-00004" in info.value.message
    assert read_progress(output).shards_final == 1, "the prefix that was final stays published"
    stop = threading.Event()
    holder = threading.Thread(target=follow_merge, args=(job, output), kwargs=dict(poll_secs=0.05, stop=stop))
    holder.start()
    try:
        time.sleep(0.3)
        with pytest.raises(MergeBusyError) as busy:
            follow_merge(job, output, wait=False)
        assert str(partial_path(output)) == busy.value.where
    finally:
        stop.set()
        holder.join(10)


def test_a_corrupt_done_marker_stops_the_stream_with_the_shard_and_how_to_requeue_it(job, tmp_path):
    run_worker(job, identity(), copy_runner(), WorkerSettings(**LEASE))
    shard = "part-00002-of-00004"
    marker = job / "done" / f"{shard}.json"
    marker.write_bytes(marker.read_bytes()[:40])  # torn
    with pytest.raises(IntegrityError, match="corrupt done marker") as streamed:
        follow_merge(job, tmp_path / "merged.jsonl", wait=False)
    assert streamed.value.where == f"shard {shard}"
    assert "dj-elastic retry" in streamed.value.hint and f"--shard-id {shard}" in streamed.value.hint
    assert read_progress(tmp_path / "merged.jsonl").shards_final == 2  # the shards before it stay final
    with pytest.raises(IntegrityError) as plain:
        merge_job(job, tmp_path / "plain.jsonl")
    assert str(streamed.value) == str(plain.value)


def test_cli_merge_follow_publishes_progress_while_workers_run(job, tmp_path):
    output = tmp_path / "merged.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "data_juicer_elastic.cli", "merge", "--job-dir", str(job), "--output", str(output)]
        + ["--follow", "--poll-secs", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _run_one(job, 0)
        deadline = time.monotonic() + 60
        while (read_progress(output) is None) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert read_progress(output).shards_final >= 1 and not output.exists()
        run_worker(job, identity(), copy_runner(), WorkerSettings(**LEASE))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "1/4 shards" in out and "4/4 shards" in out and "merged 40 rows" in out
    assert output.read_bytes() == _plain(job, tmp_path)
    assert read_progress(output).complete and progress_path(output).exists()


def test_progress_record_is_versioned_and_parsed_defensively(job, tmp_path):
    output = tmp_path / "merged.jsonl"
    progress_path(output).write_text('{"format": "dj-elastic/merge-progress", "version": 99}')
    with pytest.raises(JobDirError, match="version 99"):
        read_progress(output)
    fsio.remove(progress_path(output))
    run_worker(job, identity(), copy_runner(), WorkerSettings(**LEASE))
    assert follow_merge(job, output, wait=False).rows == 40
