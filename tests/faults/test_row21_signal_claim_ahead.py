"""Fault matrix row 21: SIGTERM while a worker holds a shard claimed ahead, at the two moments
where a worker could leave that claim to expire after a whole TTL.

* the running shard was published and the worker waits in ``ClaimAhead.take()`` for the
  helper's check and read of the shard claimed ahead (a slow read);
* the running shard's run ended and the helper is still claiming the next one (a slow claim:
  NFS round trips), so the claim appears only after the signal.

Either way the claim is released at once, reason ``signal``, the worker dies by the signal, and
another worker takes the shard without waiting (TTL 60 s here).  Slowness is injected at the
seam (``mode: delay``); the worker is the real worker loop in its own process (``driver``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .commands import release_reason
from .conftest import REPO, driver_cmd, driver_env, run_driver, summary_of
from .fakes import prepare

S0, S1 = "part-00000-of-00004", "part-00001-of-00004"
DELAYED = "fault injected: delaying"


def _signalled_inside(job: Path, tmp_path: Path, rules: list[dict]) -> int:
    """A worker (fake runner, 0.3 s a shard) with ``rules``; SIGTERM once it logs that it is
    inside the first delayed operation.  Its exit status."""
    log = tmp_path / "worker.err"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            driver_cmd("worker", job, "--sleep", "0.3", "--heartbeat", "10"),
            cwd=REPO, env=driver_env(faults=rules), stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while DELAYED not in _stderr(proc, log):
        assert proc.poll() is None, f"the worker exited ({proc.returncode}) first: {_stderr(proc, log)[-3000:]}"
        assert time.monotonic() < deadline, f"never reached the delayed operation: {_stderr(proc, log)[-3000:]}"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    return proc.returncode


def _stderr(proc, log: Path) -> str:
    return log.read_text() if log.exists() else ""


def _delay(op: str, path: str, secs: float) -> dict:
    return {"op": op, "path": path, "mode": "delay", "delay_secs": secs}


# The hand-back's own release record is slow too (NFS): a worker must wait for it before it dies.
SLOW_RELEASE = _delay("link", f"/releases/{S1}/", 1)


@pytest.mark.parametrize(
    "moment, rules",
    [
        ("waiting for the read-ahead", [_delay("open", f"/shards/{S1}", 4), SLOW_RELEASE]),
        ("its claim in flight", [_delay("link", f"/claims/{S1}/", 4), SLOW_RELEASE]),
    ],
)
def test_sigterm_releases_the_shard_claimed_ahead_at_once(tmp_path, moment, rules):
    job = prepare(tmp_path)
    assert _signalled_inside(job, tmp_path, rules) == -signal.SIGTERM
    assert release_reason(job, S1) == "signal", f"{moment}: the shard claimed ahead was not handed back"
    if moment == "its claim in flight":  # the running shard had ended, not yet published
        assert release_reason(job, S0) == "signal"
    assert not (job / "attempts" / S1).exists(), "the shard claimed ahead never became an attempt"
    summary = summary_of(run_driver("worker", job, "--no-wait"))  # TTL 60 s: only a release lets it in now
    assert summary["complete"] and summary["unrun"] == 0
