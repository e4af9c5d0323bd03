"""Fault matrix row 16: a frozen Ray runtime under a live worker process.

Only the worker's Ray processes are stopped (SIGSTOP); its main process, and so its heartbeat
thread, lives on.  A heartbeat must mean progress: after ``stall_timeout_secs`` without
progress or an answer from Ray, the worker gives the shard up (a ``stalled`` failure record
and a release), kills the frozen runtime, restarts itself (exec: same pid, a fresh runtime)
and finishes the job.  Through ``dj-elastic prepare / worker / merge`` with real Ray.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from .commands import env, merged_rows, slow_job

pytestmark = [pytest.mark.ray]

STALL_SECS = 20.0  # well above a probe's round trip on a loaded 2-core machine


def _wait(predicate, what: str, timeout: float, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the worker exited ({proc.returncode}) before {what}: {proc.stdout.read()[-4000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _processing(job: Path) -> str | None:
    for path in job.glob("attempts/*/*/progress.json"):
        try:
            record = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if record.get("stage") == "processing":
            return record["shard_id"]
    return None


def _failures(job: Path) -> list[dict]:
    return [json.loads(p.read_bytes()) for p in sorted(job.glob("failures/*/gen-*.json"))]


@pytest.mark.extended
def test_a_worker_whose_ray_processes_are_stopped_gives_the_shard_up_and_restarts_ray(tmp_path):
    elastic = {"num_shards": 2, "lease_ttl_secs": 30, "heartbeat_interval_secs": 2, "stall_timeout_secs": STALL_SECS}
    job = slow_job(tmp_path, 12, 0.5, **elastic)
    worker = subprocess.Popen(
        [sys.executable, "-m", "data_juicer_elastic.cli", "worker", "--job-dir", str(job)],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    stopped: list[psutil.Process] = []
    try:
        shard = _wait(lambda: _processing(job), "a shard being processed", 240, worker)
        # Every process of the worker but the worker itself: its Ray runtime (GCS, raylet, workers).
        stopped = psutil.Process(worker.pid).children(recursive=True)
        assert any("raylet" in p.name() for p in stopped), [p.name() for p in stopped]
        for p in stopped:
            p.send_signal(signal.SIGSTOP)

        given_up = _wait(
            lambda: [f for f in _failures(job) if f["exit_reason"] == "stalled"], "the stall give-up", 180, worker
        )
        assert [f["shard_id"] for f in given_up] == [shard] and "no sign of life" in given_up[0]["error"]
        # the release follows the failure record (two writes): wait for it rather than race it
        released = job / "releases" / shard / f"gen-{given_up[0]['generation']:06d}.json"
        _wait(lambda: released.exists(), "the stalled claim's release", 30, worker)
        release = json.loads(released.read_bytes())
        assert release["reason"] == "stalled", "given up at once, not left to expire"

        out, _ = worker.communicate(timeout=300)
        assert worker.returncode == 0, out[-4000:]
        assert "restarting this worker (1/5) with a fresh Ray runtime" in out
        assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in stopped), "frozen runtime left"
        done = json.loads((job / "done" / f"{shard}.json").read_bytes())
        assert done["generation"] > given_up[0]["generation"]
        assert [row["id"] for row in merged_rows(job, tmp_path / "merged.jsonl")] == list(range(12))
    finally:
        for p in stopped:
            try:
                p.kill()
            except psutil.Error:
                pass
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
