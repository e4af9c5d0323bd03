"""Helpers for coordination tests: real job directories, fake phases, no Ray."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from data_juicer_elastic.coordination.flow import Phases
from data_juicer_elastic.coordination.run import RunCoordinator, RunId
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.prepare import prepare_job

from ..jobdir.conftest import copy_runner, identity, make_rows, request, write_rows

FAST = SimpleNamespace(ttl_secs=3.0, poll_secs=0.05, wait_timeout_secs=2.0)


def coordinator(job: Path, node: str, run: str = "run-1", **kw) -> RunCoordinator:
    options = dict(ttl_secs=FAST.ttl_secs, heartbeat_secs=0.5, poll_secs=FAST.poll_secs)
    options.update(kw)
    return RunCoordinator(JobLayout(job), RunId(run, "elastic.run_id"), identity(node), **options)


class Recorder:
    """Fake phases over a real job directory; counts what each instance did."""

    def __init__(self, tmp: Path, num_shards: int = 4, run_shard=None, prepare_error: Exception | None = None):
        self.data = write_rows(tmp / "data" / "input.jsonl", make_rows(40))
        self.job = tmp / "job"
        self.output = tmp / "merged.jsonl"
        self.num_shards = num_shards
        self.run_shard = run_shard or copy_runner()
        self.prepare_error = prepare_error
        self.lock = threading.Lock()
        self.calls: dict[str, list[str]] = {"prepare": [], "check": [], "finalize": [], "work": []}

    def _log(self, what: str, node: str) -> None:
        with self.lock:
            self.calls[what].append(node)

    def phases(self, node: str, max_retries: int = 0) -> Phases:
        def prepare():
            self._log("prepare", node)
            if self.prepare_error is not None:
                raise self.prepare_error
            outcome = prepare_job(request(self.job, self.data, self.num_shards))
            return outcome.manifest, outcome.created

        def work(stop: threading.Event, max_done: int | None):
            self._log("work", node)
            return run_worker(
                self.job,
                identity(node),
                self.run_shard,
                WorkerSettings(
                    ttl_secs=FAST.ttl_secs,
                    heartbeat_secs=0.5,
                    max_retries=max_retries,
                    poll_interval_secs=FAST.poll_secs,
                    max_done=max_done,
                ),
                stop_event=stop,
            )

        def finalize():
            self._log("finalize", node)
            result = merge_job(self.job, self.output)
            return {"output_path": str(result.output_path), "rows": result.rows, "shards": result.shards}

        return Phases(prepare, lambda manifest: self._log("check", node), work, finalize)


@pytest.fixture
def recorder(tmp_path) -> Recorder:
    return Recorder(tmp_path)
