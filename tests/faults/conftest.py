"""Helpers for the fault matrix: worker processes with a fault plan in their environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .crashpoints import hooked_pythonpath

REPO = Path(__file__).resolve().parents[2]


def driver_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.faults.driver", *map(str, args)]


def driver_env(node: str | None = None, crash: str | None = None, faults: list[dict] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJ_ELASTIC_TEST_")}
    env["PYTHONPATH"] = hooked_pythonpath(os.environ.get("PYTHONPATH"))  # installs the plan below at start
    env["PYTHONFAULTHANDLER"] = "1"  # a worker that dies of a signal leaves its threads' stacks in stderr
    if node:
        env["DJ_ELASTIC_NODE_ID"] = node
    if crash:
        env["DJ_ELASTIC_TEST_CRASH_AT"] = crash
    if faults:
        env["DJ_ELASTIC_TEST_FAULTS"] = json.dumps(faults)
    return env


def run_driver(*args: str, timeout: float = 120, **env_kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        driver_cmd(*args), cwd=REPO, env=driver_env(**env_kw), capture_output=True, text=True, timeout=timeout
    )


def dj_elastic_status(job: Path, *args: str) -> subprocess.CompletedProcess:
    """The real `dj-elastic status` (this checkout), as a user runs it."""
    return subprocess.run(
        ["dj-elastic", "status", "--job-dir", str(job), *args],
        env=driver_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def start_driver(*args: str, **env_kw) -> subprocess.Popen:
    return subprocess.Popen(
        driver_cmd(*args),
        cwd=REPO,
        env=driver_env(**env_kw),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def summary_of(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])
