"""`dj-elastic status` from the job summary: what it shows agrees with the job directory, and what
it costs does not grow with the shards that are done.

Oracles: ``snapshot(exact=True)`` (every record opened by name: what finalize acts on) over the
same job, read while real worker loops hold their shards still; the done markers themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.jobdir import heartbeats, task_queue
from data_juicer_elastic.jobdir.job_summary import PaceWriter, read_summary
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import ShardResult, TakeoverReason
from data_juicer_elastic.jobdir.shard_state import ShardState
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.sharedfs import fault_seam, fsio
from data_juicer_elastic.sharedfs.identity import attempt_started_at
from data_juicer_elastic.status.job_status import snapshot, snapshot_json
from data_juicer_elastic.status.job_view import read_view
from data_juicer_elastic.status.snapshot_types import FROM_JOB_DIR, FROM_SUMMARY, ShardStatus
from data_juicer_elastic.status.throughput import summarize

from .conftest import copy_runner, identity, make_rows, request, write_rows
from .test_job_summary import _job, _keeper

WORKERS = 3


class HeldRunner:
    """The copy runner, which holds every shard after the first ``free`` finished until released:
    the job stands still with one running attempt per worker."""

    def __init__(self, free: int, pause: float = 0.0):
        self.pause = pause
        self.free, self.copy = free, copy_runner(lambda row: row if row["id"] % 3 else None)  # output != input
        self.release = threading.Event()
        self.lock, self.started, self.waiting = threading.Lock(), 0, 0

    def __call__(self, task):
        with self.lock:
            self.started += 1
            hold = self.started > self.free
            self.waiting += hold
        if hold:
            self.release.wait(timeout=120)
        time.sleep(self.pause)
        return self.copy(task)


def _run_workers(job: Path, runner: HeldRunner) -> tuple[list[threading.Thread], list]:
    results: list = []

    def work(k: int) -> None:
        results.append(
            run_worker(
                job,
                identity(f"node-{k}"),
                runner,
                WorkerSettings(
                    ttl_secs=4.0, heartbeat_secs=0.5, max_retries=1, poll_interval_secs=0.05, claim_ahead=False
                ),
            )
        )

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(WORKERS)]
    for thread in threads:
        thread.start()
    return threads, results


def _until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _two_new_summaries(layout: JobLayout, manifest) -> None:
    """Wait until the summary is rewritten twice: the second round was composed after this call."""
    seen = []

    def advanced() -> bool:
        summary = read_summary(layout, manifest)
        if summary is not None and (not seen or seen[-1] != summary.seq):
            seen.append(summary.seq)
        return len(seen) >= 3

    _until(advanced, "two new rounds of the job summary")


def _agree(fast, oracle) -> None:
    """What status from the summary shows, against the exact snapshot of the same job."""
    assert fast.source == FROM_SUMMARY and oracle.source == FROM_JOB_DIR
    assert fast.counts == oracle.counts
    assert [s.state for s in fast.shards] == [s.state for s in oracle.shards]
    assert (fast.rows_done, fast.rows_total, fast.complete) == (oracle.rows_done, oracle.rows_total, oracle.complete)
    assert fast.output_rows == oracle.output_rows
    for mine, truth in zip(fast.shards, oracle.shards, strict=True):
        if mine.state is ShardState.RUNNING:  # running attempts: read exactly as the walk reads them
            assert (mine.owner_node, mine.attempt_id, mine.generation) == (
                truth.owner_node,
                truth.attempt_id,
                truth.generation,
            )
            assert mine.progress is None or mine.progress.attempt_id == truth.attempt_id
        if mine.state is ShardState.DONE:  # nothing of a done shard is read
            assert (mine.owner_node, mine.output_rows, mine.generation, mine.quarantined) == (None, None, None, None)
    nodes = {n.node_id: n for n in summarize(fast).nodes}
    truth = {n.node_id: n for n in summarize(oracle).nodes}
    assert {n: (v.running, v.shards_done, v.output_rows, v.rows_done) for n, v in nodes.items()} == {
        n: (v.running, v.shards_done, v.output_rows, v.rows_done) for n, v in truth.items()
    }
    document = snapshot_json(fast)
    assert document["source"] == "summary" and document["summary"]["seq"]
    # the workers' pace records count quarantined rows and know their first claim
    assert document["quarantined_rows"] == oracle.quarantined_rows
    json.dumps(document)  # every field is JSON data
    starts = [t for s in oracle.shards if (t := attempt_started_at(s.attempt_id)) is not None]
    times = read_view(oracle.job_dir).times
    if starts:  # first claim (pace records) vs the earliest attempt id: the same moment
        assert abs(times.first_running_at - min(starts)) <= 1.0
        assert times.submitted_at == oracle.scan.planned_at  # no run record: the plan's time


@pytest.mark.parametrize("shards, free", [(12, 4), (20, 9)])
def test_status_from_the_summary_agrees_with_the_job_directory_mid_job_and_at_the_end(tmp_path, shards, free):
    job = tmp_path / "job"
    prepare_job(request(job, write_rows(tmp_path / "in.jsonl", make_rows(shards * 3)), shards))
    layout, manifest = JobLayout(job), load_manifest(job)
    runner = HeldRunner(free)
    threads, results = _run_workers(job, runner)
    try:
        _until(lambda: runner.waiting == WORKERS, "every worker holding a shard")
        _two_new_summaries(layout, manifest)
        fast, oracle = snapshot(job, exact=False), snapshot(job)
        _agree(fast, oracle)
        assert fast.counts[ShardState.RUNNING] == WORKERS and fast.counts[ShardState.DONE] == free
        assert fast.counts[ShardState.PENDING] == shards - free - WORKERS
    finally:
        runner.release.set()
        for thread in threads:
            thread.join(timeout=120)
    assert len(results) == WORKERS and all(r.complete for r in results)
    fast, oracle = snapshot(job, exact=False), snapshot(job)
    _agree(fast, oracle)
    assert fast.complete and fast.counts[ShardState.DONE] == shards


def test_a_shard_finished_after_the_summary_is_done_and_one_claimed_after_it_is_pending(tmp_path, clock):
    job, layout, manifest, peers = _job(tmp_path, 12, done=4, held=3)
    _keeper(layout, manifest, clock).tick()
    first = peers[0][0]

    late = manifest.shards[4]  # held in the summary, finished since
    result = ShardResult(late.shard_id, "peer-0", 1, "p-0", late.rows, 1, "0" * 64, "x", late.rows, "0", 1.0)
    layout.done(late.shard_id).write_bytes(result.encode())
    newcomer = manifest.shards[10]  # claimed after the summary was written
    claim = task_queue.publish_claim(
        layout, task_queue.read_lease(layout, newcomer.shard_id), first, "n-1", TakeoverReason.FIRST
    )
    heartbeats.write_heartbeat(layout, claim, 1)
    fast, oracle = snapshot(job, exact=False), snapshot(job)
    states = {s.shard_id: s.state for s in fast.shards}
    truth = {s.shard_id: s.state for s in oracle.shards}
    assert states[late.shard_id] is truth[late.shard_id] is ShardState.DONE
    assert truth[newcomer.shard_id] is ShardState.RUNNING and states[newcomer.shard_id] is ShardState.PENDING
    assert {k: v for k, v in states.items() if k != newcomer.shard_id} == {
        k: v for k, v in truth.items() if k != newcomer.shard_id
    }


class ThreadOps:
    """Metadata operations, by thread (a summary writer's heartbeat thread runs beside status)."""

    def __init__(self):
        self.thread, self.trace = threading.get_ident(), []

    def __call__(self, op: str, path: Path) -> None:
        self.trace.append((threading.get_ident() == self.thread, op, str(path)))


def _status_ops(layout: JobLayout, *, use_summary: bool = True) -> tuple:
    """The snapshot, the operations of this thread (all of them with the summary), the reads in
    ``done/`` of any thread (the walk reads done markers with a few threads)."""
    ops = ThreadOps()
    fault_seam.set_fault_hook(ops)
    try:
        snap = snapshot(layout.root, exact=False, use_summary=use_summary)
    finally:
        fault_seam.set_fault_hook(None)
    done_dir = str(layout.done_dir)
    ours = [(op, path) for mine, op, path in ops.trace if mine]
    return snap, ours, [(op, path) for _, op, path in ops.trace if path.startswith(done_dir + os.sep)]


def _done_by_a_peer(layout: JobLayout, entries) -> None:
    for entry in entries:
        result = ShardResult(entry.shard_id, "other-1", 1, "peer", entry.rows, 1, "0" * 64, "x", entry.rows, "0", 1.0)
        fsio.write_new(layout.done(entry.shard_id), result.encode(), durable=False)


def _peer_counted(pace: PaceWriter, entries) -> None:
    """The peer's pace record counts ``entries`` as its accepted results too (as its worker would)."""
    for entry in entries:
        pace.finished(1.0, entry.rows, entry.rows)
    pace.flush()


@pytest.mark.extended  # 1,026 shards, 1,000 done markers: a large case
def test_what_status_reads_does_not_grow_with_the_done_shards(tmp_path, clock):
    """100 done, then 1,000 done (5 running, the rest pending): the same operations, none in done/
    but its listing; without the summary, a read per done shard.  Then one done shard that no pace
    record counts (its worker killed before it wrote its record): every done marker is read, so
    the per-node counts still add up to the done shards."""
    held = 5
    job, layout, manifest, _ = _job(tmp_path, 1_000 + held + 21, done=100, held=held)
    keeper = _keeper(layout, manifest, clock)
    measured = []
    peer = PaceWriter(layout, identity("peer", pid=60_000, hostname="host-peer", boot_id="boot-peer"))
    for done in (100, 1_000):
        if done > 100:
            _done_by_a_peer(layout, manifest.shards[held + 100 : held + done])  # after the held ones
        _peer_counted(peer, manifest.shards[held + 100 : held + done] if done > 100 else manifest.shards[:100])
        keeper.tick()
        snap, trace, in_done = _status_ops(layout)
        assert snap.source == FROM_SUMMARY
        assert snap.counts[ShardState.DONE] == done and snap.counts[ShardState.RUNNING] == held
        assert in_done == [] and trace.count(("listdir", str(layout.done_dir))) == 1, "one listing, no marker read"
        walk, _, walk_in_done = _status_ops(layout, use_summary=False)
        assert walk.counts == snap.counts and len(walk_in_done) == done, "without the summary: a read per done shard"
        measured.append(trace)
    small, big = measured
    assert len(big) == len(small), (small, big)
    per_live = 10  # the lease (claims/ listing, a probe, claim, release, failure, heartbeat), its mtime, progress
    assert len(big) <= 20 + per_live * held, big

    _done_by_a_peer(layout, manifest.shards[held + 1_000 : held + 1_001])  # no pace record counts it
    keeper.tick()
    snap, _, in_done = _status_ops(layout)
    assert snap.counts[ShardState.DONE] == 1_001 and len(in_done) == 1_001, "every done marker read once"
    assert [(t.node_id, t.shards_done) for t in snap.node_tallies] == [("peer", 1_001)]


def test_status_json_of_a_finished_job_through_the_command(tmp_path):
    shards = 9
    job = tmp_path / "job"
    prepare_job(request(job, write_rows(tmp_path / "in.jsonl", make_rows(40)), shards))
    runner = HeldRunner(shards, pause=0.4)  # nothing is held; a few seconds in all: the summary is written
    threads, results = _run_workers(job, runner)
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == WORKERS and all(r.complete for r in results)
    layout = JobLayout(job)
    assert read_summary(layout, load_manifest(job)) is not None
    oracle = snapshot(job)

    def status(*args: str) -> tuple[int, dict]:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        cmd = [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--job-dir", str(job), "--json", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        return proc.returncode, json.loads(proc.stdout)

    code, data = status()
    assert code == 0 and data["source"] == "summary" and data["complete"] is True
    assert data["counts"] == {state.value: n for state, n in oracle.counts.items()}
    assert (data["rows_done"], data["rows_total"], data["output_rows"]) == (
        oracle.rows_done,
        oracle.rows_total,
        oracle.output_rows,
    )
    assert data["quarantined_rows"] == oracle.quarantined_rows and data["eta_secs"] == 0.0
    assert len(data["shards"]) == shards and all(s["state"] == "done" for s in data["shards"])
    assert all(s["owner_node"] is None and s["output_rows"] is None for s in data["shards"])
    by_node = {n.node_id: (n.shards_done, n.output_rows) for n in summarize(oracle).nodes}
    assert {n["node_id"]: (n["shards_done"], n["output_rows"]) for n in data["nodes"]} == by_node
    code, full = status("--all")
    assert code == 0 and full["source"] == "job directory" and full["summary"] is None
    assert [s["owner_node"] for s in full["shards"]] == [s.owner_node for s in oracle.shards]
    assert full["quarantined_rows"] == 0 and full["output_rows"] == data["output_rows"]


def test_status_reads_the_light_manifest_and_refuses_a_damaged_one_as_the_full_read_does(tmp_path, clock):
    """`status` loads the manifest without validated entries when its checksum matches: the same
    snapshot as from the full manifest; a damaged manifest is the full path's one clear error."""
    held = 3
    job, layout, manifest, _ = _job(tmp_path, 30, done=10, held=held)
    _keeper(layout, manifest, clock).tick()
    light = load_manifest(job, entries=False)
    assert type(light.shards[0]).__name__ == "ShardRow" and len(light.shards) == 30
    full = snapshot_json(snapshot(job, exact=False, manifest=manifest, now=1.0))
    assert snapshot_json(snapshot(job, exact=False, now=1.0)) | {"taken_at": 0} == full | {"taken_at": 0}

    text = (job / "manifest.json").read_text()
    (job / "manifest.json").write_text(text.replace('"rows": 1,', '"rows": 2,', 1))  # still valid JSON
    proc = subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--job-dir", str(job), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "inconsistent manifest" in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1, "one error line, where and what to do"
    assert proc.stdout == "" and "Traceback" not in proc.stderr


@pytest.mark.parametrize("state, failures, quarantined", [("done", None, None), ("pending", 0, 0), ("done", 0, None)])
def test_an_unread_shard_is_the_shard_status_init_builds_field_for_field(state, failures, quarantined):
    """ShardStatus.unread skips the dataclass __init__: the same object, its fields in the same order
    (orjson writes a dataclass from its __dict__, so the order is the --json output's)."""
    fast = ShardStatus.unread("part-00001-of-00004", ShardState(state), 7, failures, quarantined)
    slow = ShardStatus("part-00001-of-00004", ShardState(state), None, None, None, None, None, None, failures, None, 7,
                       None, None, quarantined=quarantined)  # fmt: skip
    assert fast == slow and list(vars(fast)) == list(vars(slow)) == [f.name for f in fields(ShardStatus)]
    assert orjson.dumps(fast) == orjson.dumps(slow) and fast.to_json() == slow.to_json()
