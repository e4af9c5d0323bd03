"""A small run of benchmarks/bench_scale.py, shared by the tests that read its counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def small_scale_bench(tmp_path_factory) -> dict:
    """bench_scale.py at a small size (a subprocess: it wraps the worker loop's functions to count
    per activity).  The claims runs: TTL 2 s (a summary round every 0.25 s) and 50 ms per shard,
    so most claims find a summary; the idle runs: TTL 4 s, the holders beat every second, the
    idle worker polls every 0.25 s."""
    work = tmp_path_factory.mktemp("bench-scale")
    out = work / "result.json"
    command = [sys.executable, str(REPO / "benchmarks" / "bench_scale.py"), "--workdir", str(work / "w")]
    command += ["--out", str(out), "--workers", "4", "--shards", "96", "--poll", "0.1", "--ttl", "2"]
    command += ["--shard-sleep", "0.05"]
    command += ["--held", "2", "6", "--idle-shards", "24", "--finishers", "2", "--polls", "6"]
    command += ["--idle-poll", "0.25", "--idle-ttl", "4"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"result": json.loads(out.read_text()), "stdout": result.stdout}
