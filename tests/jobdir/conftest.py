"""Shared helpers for jobdir tests: tiny inputs, prepared jobs, a fake shard runner, a fake clock."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from data_juicer_elastic.jobdir.attempts import ScanTask, ShardOutput, ShardTask
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import (
    load_manifest,
    load_plan,
    locate_shard,
    normalise_options,
    publish_manifest,
    source_spans,
)
from data_juicer_elastic.jobdir.records import ScanResult
from data_juicer_elastic.jobdir.shard_state import refusal_error
from data_juicer_elastic.rows.shard_source import iter_source_lines
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job
from data_juicer_elastic.shards.scan import ShardScanner
from data_juicer_elastic.sharedfs.identity import WorkerIdentity


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += secs


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def make_rows(n: int, start: int = 0) -> list[dict]:
    return [{"id": i, "text": f"row {i} " + "x" * (i % 13)} for i in range(start, start + n)]


def request(job: Path, data: Path, num_shards: int = 4, **kw) -> PrepareRequest:
    fields = dict(recipe={"process": [{"demo_mapper": None}]}, stage_identities=["stage-a"])
    fields.update(kw)
    return PrepareRequest(job_dir=job, dataset_path=data, num_shards=num_shards, **fields)


VICTIM = """
import os, signal, sys, time
from data_juicer_elastic.jobdir import heartbeats, task_queue
from data_juicer_elastic.sharedfs.identity import WorkerIdentity
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker

layout = JobLayout(sys.argv[1])

def run(task):
{before_kill}
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)

settings = WorkerSettings(ttl_secs=60, heartbeat_secs=10, max_retries=1, poll_interval_secs=1)
run_worker(sys.argv[1], WorkerIdentity.current("victim"), run, settings)
"""


def run_victim(job: Path, tmp_path: Path, before_kill: str = "    pass") -> None:
    """A worker whose first shard runs ``before_kill`` (indented code), then sends the worker
    SIGTERM, over ``job`` in a child process: it must die by the signal."""
    path = tmp_path / "victim.py"
    path.write_text(VICTIM.format(before_kill=before_kill))
    proc = subprocess.run([sys.executable, str(path), str(job)], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM, proc.stderr.decode()[-2000:]


def identity(node: str = "node-a", pid: int | None = None, **kw) -> WorkerIdentity:
    me = WorkerIdentity.current(node)
    if pid is not None:
        kw["pid"] = pid
    return WorkerIdentity(**{**me.__dict__, **kw})


def shard_lines(job: Path, shard_id: str | None = None) -> list[bytes]:
    """The rows of the job's shards (or one), as a worker reads them: in place or from their copy,
    normalised, checked against their manifest."""
    layout, manifest = JobLayout(job), load_manifest(job)
    entries = [e for e in manifest.shards if shard_id in (None, e.shard_id)]
    return [line for e in entries for line in iter_source_lines(locate_shard(layout, manifest, e))]


def scan_locally(job: Path, processes: int = 0):
    """Scan every shard of a planned job here with ``processes`` row-checking helpers, and publish
    the manifest (or raise the job's input error): the data path without the lease protocol
    around it (``jobdir.worker`` and its tests cover that)."""
    layout, plan = JobLayout(job), load_plan(job)
    scanner, options, results = (
        ShardScanner(processes=processes),
        normalise_options(plan, max_line_bytes=plan.max_line_bytes),
        {},
    )
    try:
        for entry in plan.shards:
            out = scanner(ScanTask(entry.shard_id, source_spans(plan.inputs, entry.spans), options, job))
            results[entry.shard_id] = ScanResult(
                entry.shard_id, "a", 1, "n", out.rows, out.bytes, out.sha256, out.span_rows, out.schema,
                out.normalise, out.longest_line, 0.0, 1.0, refusal=out.refusal,
            )  # fmt: skip
    finally:
        scanner.close()
    refused = refusal_error(plan, results)
    if refused is not None:
        raise refused
    return publish_manifest(layout, plan, results)


def copy_runner(transform: Callable[[dict], dict | None] | None = None) -> Callable[[ShardTask], ShardOutput]:
    """A fake run_shard: reads the input shard, writes (transformed) rows to attempt_dir/output.jsonl."""

    def run(task: ShardTask) -> ShardOutput:
        rows = [json.loads(line) for line in iter_source_lines(task.source)]
        if transform is not None:
            rows = [r for r in map(transform, rows) if r is not None]
        out = task.attempt_dir / "output.jsonl"
        out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return ShardOutput(out, len(rows))

    return run


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A prepared job: 40 rows in 4 shards, copied into the job directory (copy_shards), so a
    test can reach (and tamper with) a shard's file; shards read in place are test_plan_scan's."""
    data = write_rows(tmp_path / "data" / "input.jsonl", make_rows(40))
    job_dir = tmp_path / "job"
    prepare_job(request(job_dir, data, 4, copy_shards=True))
    return job_dir
