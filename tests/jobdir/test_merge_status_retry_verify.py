from __future__ import annotations

import json

import pytest

from data_juicer_elastic.errors import ConfigError, IntegrityError, JobDirError, OutputExistsError
from data_juicer_elastic.jobdir import heartbeats, task_queue
from data_juicer_elastic.jobdir.exports import MergeRecord
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.retry import retry_shards
from data_juicer_elastic.jobdir.shard_state import ShardState, observe_state
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.verify import verify_job
from data_juicer_elastic.sharedfs.identity import WorkerIdentity
from data_juicer_elastic.status.job_status import snapshot, snapshot_json

from .conftest import copy_runner, identity

LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=1.0)
BAD = "part-00002-of-00004"


def _fail_bad(task):
    if task.shard_id == BAD:
        raise ValueError("poison row")
    return copy_runner()(task)


def _complete(job, node="n1", **kw):
    return run_worker(job, identity(node), copy_runner(**kw), WorkerSettings(max_retries=1, **LEASE))


def _output_of(job, shard):
    result = json.loads((job / "done" / f"{shard}.json").read_text())
    return job / result["output"]


def test_merge_follows_manifest_order_and_is_idempotent(job, tmp_path):
    _complete(job)
    out = tmp_path / "out" / "merged.jsonl"
    first = merge_job(job, out)
    assert first.written and first.rows == 40 and first.shards == 4
    expected = b"".join(_output_of(job, f"part-0000{i}-of-00004").read_bytes() for i in range(4))
    assert out.read_bytes() == expected
    again = merge_job(job, out)
    assert not again.written and again.sha256 == first.sha256
    record = MergeRecord.parse((job / "merge.json").read_bytes(), "merge.json")
    assert record.sha256 == first.sha256 and [s.shard_id for s in record.shards] == [
        f"part-0000{i}-of-00004" for i in range(4)
    ]


def test_merge_refuses_a_different_existing_output_unless_overwrite(job, tmp_path):
    _complete(job)
    out = tmp_path / "merged.jsonl"
    out.write_text("someone else's file\n")
    with pytest.raises(OutputExistsError) as info:
        merge_job(job, out)
    assert str(out) in str(info.value) and "overwrite" in info.value.hint
    assert out.read_text() == "someone else's file\n"
    assert merge_job(job, out, overwrite=True).written
    assert sum(1 for _ in out.open()) == 40
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".merged")] == []


def test_merge_requires_every_shard_and_names_missing_and_failed(job, tmp_path):
    run_worker(job, identity(), _fail_bad, WorkerSettings(max_retries=0, max_shards=3, **LEASE))
    with pytest.raises(JobDirError) as info:
        merge_job(job, tmp_path / "out.jsonl")
    assert f"1 failed ({BAD})" in info.value.message and "part-00003-of-00004" in info.value.message
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    "corrupt, expected",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-5]), "no newline"),
        (lambda p: p.write_bytes(p.read_bytes().replace(b"row", b"rOw", 1)), "expected rows="),
        (lambda p: p.write_bytes(p.read_bytes() + b'{"extra": 1}\n'), "found rows=11"),
        (lambda p: p.unlink(), "missing"),
    ],
)
def test_corrupt_accepted_output_fails_merge_and_verify_naming_the_shard(job, tmp_path, corrupt, expected):
    _complete(job)
    corrupt(_output_of(job, "part-00001-of-00004"))
    for action in (lambda: merge_job(job, tmp_path / "out.jsonl"), lambda: verify_job(job)):
        with pytest.raises(IntegrityError, match=expected) as info:
            action()
        assert info.value.where == "shard part-00001-of-00004"
    assert not (tmp_path / "out.jsonl").exists()


def test_corrupt_done_marker_never_counts_as_done(job, tmp_path):
    _complete(job)
    marker = job / "done" / "part-00003-of-00004.json"
    marker.unlink()
    marker.write_bytes(b'{"format": "dj-elastic/result", "version": 1, "shard_id": ')
    with pytest.raises(IntegrityError, match="corrupt done marker"):
        merge_job(job, tmp_path / "out.jsonl")
    snap = snapshot(job)
    assert snap.counts[ShardState.FAILED] == 1 and not snap.complete


def test_status_counts_rows_and_json_schema(job):
    layout = JobLayout(job)
    snap = snapshot(job)
    assert snap.counts[ShardState.PENDING] == 4 and snap.rows_done == 0 and snap.rows_total == 40
    run_worker(job, identity("w"), _fail_bad, WorkerSettings(max_retries=0, max_shards=3, **LEASE))
    running = "part-00003-of-00004"
    c = task_queue.publish_claim(
        layout, task_queue.read_lease(layout, running), identity("peer", boot_id="x"), "p", "none"
    )
    heartbeats.write_heartbeat(layout, c, 1)
    snap = snapshot(job)
    states = {s.shard_id: s.state for s in snap.shards}
    assert states[BAD] is ShardState.FAILED and states[running] is ShardState.RUNNING
    assert snap.counts[ShardState.DONE] == 2 and snap.terminal_failures == [(BAD, "poison row")]
    assert snapshot(job, ttl_secs=-1).counts[ShardState.STALE] == 1, "mtime age is a display hint only"
    data = json.loads(str(snapshot_json(snap)))
    assert data == json.loads(json.dumps(snapshot_json(snap)))
    assert data["format"] == "dj-elastic/status" and data["version"] == 1
    assert data["counts"] == {"pending": 0, "running": 1, "stale": 0, "done": 2, "failed": 1}
    assert data["complete"] is False and data["rows_total"] == 40
    bad = next(s for s in data["shards"] if s["shard_id"] == BAD)
    assert bad["last_error"] == "poison row" and bad["failures"] == 1 and bad["attempts"] == 1


def test_status_with_an_observer_reports_stale_only_after_ttl(job, clock):
    layout = JobLayout(job)
    shard = "part-00000-of-00004"
    c = task_queue.publish_claim(
        layout, task_queue.read_lease(layout, shard), identity("peer", boot_id="x"), "p", "none"
    )
    heartbeats.write_heartbeat(layout, c, 1)
    observer = task_queue.StalenessObserver(10, clock)
    assert snapshot(job, observer=observer).shards[0].state is ShardState.RUNNING
    clock.advance(10)
    assert snapshot(job, observer=observer).shards[0].state is ShardState.STALE


def test_retry_gives_a_fresh_budget_and_archives_history(job, tmp_path):
    summary = run_worker(job, identity(), _fail_bad, WorkerSettings(max_retries=1, **LEASE))
    assert summary.terminal_failures and (job / "failed" / f"{BAD}.json").exists()
    assert retry_shards(job, all_failed=True) == [BAD]
    assert not (job / "failed" / f"{BAD}.json").exists()
    assert not list((job / "failures" / BAD).iterdir())
    archived = list((job / "history" / BAD).rglob("*.json"))
    assert len(archived) == 3  # two failures + the failed marker
    assert snapshot(job).shards[2].state is ShardState.PENDING
    summary = run_worker(
        job, identity(), copy_runner(), WorkerSettings(max_retries=1, wait_for_completion=False, **LEASE)
    )
    assert summary.complete and summary.claimed == 1
    verify_job(job)


def test_retry_refuses_unknown_not_failed_and_bad_arguments(job):
    run_worker(job, identity(), _fail_bad, WorkerSettings(max_retries=0, max_shards=3, **LEASE))
    with pytest.raises(JobDirError, match="not failed"):
        retry_shards(job, ["part-00003-of-00004"])
    with pytest.raises(JobDirError, match="is done"):
        retry_shards(job, [BAD, "part-00000-of-00004"])
    assert (job / "failed" / f"{BAD}.json").exists(), "nothing moved when any id is refused"
    with pytest.raises(JobDirError, match="unknown shard"):
        retry_shards(job, ["part-00009-of-00010"])
    with pytest.raises(JobDirError, match="invalid shard id"):
        retry_shards(job, ["../../etc"])
    with pytest.raises(ConfigError):
        retry_shards(job)
    with pytest.raises(ConfigError):
        retry_shards(job, [BAD], all_failed=True)
    assert retry_shards(job, [BAD]) == [BAD]


def test_verify_counts_distinct_nodes(job):
    run_worker(job, identity("node-a"), copy_runner(), WorkerSettings(max_retries=1, max_shards=2, **LEASE))
    run_worker(job, identity("node-b"), copy_runner(), WorkerSettings(max_retries=1, **LEASE))
    result = verify_job(job, expect_nodes=2)
    assert result.nodes == ["node-a", "node-b"] and result.output_rows == 40
    with pytest.raises(JobDirError, match=r"2 node\(s\) \(node-a, node-b\), expected at least 3"):
        verify_job(job, expect_nodes=3)


def test_render_text_and_terminal_info_attributes(job):
    from data_juicer_elastic.status.job_view import render_text

    summary = run_worker(job, identity("w"), _fail_bad, WorkerSettings(max_retries=0, **LEASE))
    assert summary.terminal_failures[0].shard_id == BAD and summary.terminal_failures[0].last_error == "poison row"
    snap = snapshot(job)
    assert snap.terminal_failures[0].shard_id == BAD
    text = render_text(snap)
    assert "done 3" in text and "failed 1" in text and BAD in text and "poison row" in text
    assert "part-00000-of-00004" not in text and "part-00000-of-00004" in render_text(snap, show_all=True)


def test_merge_removes_only_temp_files_of_merges_killed_on_this_host(job, tmp_path):
    import os
    import subprocess
    import sys

    from data_juicer_elastic.sharedfs.identity import kernel_tag

    _complete(job)
    out = tmp_path / "out.jsonl"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # exited and reaped: its pid no longer exists (unless reused at once)
    tag = kernel_tag()
    assert tag, "this machine exposes its boot id and pid namespace"
    names = {
        "dead": f".out.jsonl.tmp-{tag}-{dead_pid}-0000aaaa",
        "live": f".out.jsonl.tmp-{tag}-{os.getpid()}-0000bbbb",  # a merge still running here
        "other host": f".out.jsonl.tmp-0123456789ab-{dead_pid}-0000cccc",
        "other export": f".other.jsonl.tmp-{tag}-{dead_pid}-0000dddd",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"partial merge\n")
    merge_job(job, out)
    assert not (tmp_path / names["dead"]).exists()
    assert all((tmp_path / names[k]).exists() for k in ("live", "other host", "other export"))
    assert sum(1 for _ in out.open()) == 40


def test_settles_view_of_each_shard_is_the_status_snapshots(job, clock):
    """``observe_state`` (what settle waits on) and the status snapshot read a shard the same
    way: done, terminally failed, running, stale after the TTL on the observer's clock, pending."""
    layout = JobLayout(job)
    run_worker(
        job, identity("w"), _fail_bad, WorkerSettings(max_retries=0, max_shards=3, **LEASE)
    )  # 0, 1 done; BAD failed
    manifest = load_manifest(job)
    for shard in ("part-00003-of-00004",):
        c = task_queue.publish_claim(
            layout, task_queue.read_lease(layout, shard), identity("peer", boot_id="x"), "p", "none"
        )
        heartbeats.write_heartbeat(layout, c, 1)
    me = WorkerIdentity.current()
    seen = set()
    for advance in (0, 10):
        clock.advance(advance)
        watcher, status_watcher = task_queue.StalenessObserver(10, clock), task_queue.StalenessObserver(10, clock)
        for _ in range(2):  # the second look is after the first: both observers saw the same values
            observed = [observe_state(layout, e.shard_id, watcher, me) for e in manifest.shards]
            shown = [s.state for s in snapshot(job, observer=status_watcher).shards]
            assert observed == shown
            seen.update(observed)
            clock.advance(10)
    assert seen == {ShardState.DONE, ShardState.FAILED, ShardState.RUNNING, ShardState.STALE}
