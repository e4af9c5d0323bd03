"""Fault matrix row 26: the worker's SIGTERM handler stays in force after Ray ran a shard.

Data-Juicer's RayExecutor calls ``ray.init`` for every shard, and ``ray.init`` installs Ray's own
SIGTERM handler (``sys.exit(15)``) every time; ``compat.ray_internals`` makes it leave the
worker's.  So a SIGTERM after the first shard still releases what the worker holds (here the
shard claimed ahead, whose read-ahead is made slow at the seam) with reason ``signal``, and the
process dies by the signal (143 in a shell), as a scheduler expects.  Through the real
``dj-elastic worker`` and ``dj-process`` with Ray.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .commands import E2E_OPS, dj_process_argv, env, faults, recipe, release_reason, slow_job
from .fakes import write_input

pytestmark = [pytest.mark.ray, pytest.mark.e2e]

S0, S1 = "part-00000-of-00003", "part-00001-of-00003"
# The read-ahead of the second shard (claimed ahead once the first one's Ray run ended) is slow:
# the worker then waits for it, after one RayExecutor has run.
SLOW_READ_AHEAD = faults({"op": "open", "path": f"/shards/{S1}", "mode": "delay", "delay_secs": 60})


def _signalled_when_delayed(argv: list[str], log: Path, job: Path) -> int:
    """SIGTERM once the first shard is done (RayExecutor ran) and the worker waits for the slow
    read-ahead of the second; the exit status."""
    with open(log, "w") as err:
        proc = subprocess.Popen(argv, cwd=log.parent, env=env(SLOW_READ_AHEAD), stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 240
    while "fault injected: delaying" not in log.read_text() or not (job / "done" / f"{S0}.json").exists():
        assert proc.poll() is None, f"exited {proc.returncode} first: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"never reached the slow read-ahead: {log.read_text()[-3000:]}"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


def _check(job: Path, code: int, log: Path) -> None:
    assert code == -signal.SIGTERM, f"exit {code} (Ray's handler exits 15): {log.read_text()[-3000:]}"
    assert (job / "done" / f"{S0}.json").exists(), "the first shard ran through RayExecutor"
    assert release_reason(job, S1) == "signal", "the shard claimed ahead is handed back as a signal's, at once"
    assert not (job / "attempts" / S1).exists()


def test_a_sigtermed_worker_dies_by_the_signal_and_releases_its_claims(tmp_path):
    job = slow_job(tmp_path, 6, 0.0, num_shards=3, copy_shards=True)  # copied shards: the read-ahead opens shards/
    log = tmp_path / "worker.err"
    argv = [sys.executable, "-m", "data_juicer_elastic.cli", "worker", "--job-dir", str(job)]
    _check(job, _signalled_when_delayed(argv, log, job), log)


@pytest.mark.extended  # the same handler and the same worker loop as dj-elastic worker's (above)
def test_a_sigtermed_dj_process_dies_by_the_signal_and_releases_its_claims(tmp_path):
    ops = tmp_path / "ops"
    ops.mkdir()
    shutil.copy(E2E_OPS, ops / "e2e_ops.py")
    data = write_input(tmp_path / "input.jsonl", 6)
    job = tmp_path / "job"
    path = recipe(
        tmp_path, data, job, export=tmp_path / "out" / "merged.jsonl", elastic={"num_shards": 3, "copy_shards": True},
        process=[{"e2e_sleep_mapper": {"seconds_per_row": 0.0}}], custom_operator_paths=[str(ops / "e2e_ops.py")],
    )  # fmt: skip
    log = tmp_path / "dj-process.err"
    _check(job, _signalled_when_delayed(dj_process_argv(path), log, job), log)
