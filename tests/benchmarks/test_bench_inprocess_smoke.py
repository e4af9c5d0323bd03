"""The benchmarks that need neither Ray nor a new Data-Juicer process per side run end to end at a tiny
size (their numbers mean nothing here; the point is that the commands in benchmarks/README.md keep
working against the package's API and keep printing what they promise)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def bench(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "benchmarks" / script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO)


def table_rows(stdout: str, first: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in stdout.splitlines() if line.startswith(first)]


def test_bench_status_times_every_status_form():
    result = bench("bench_status.py", "--shards", "40", "--repeat", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    counts = re.findall(r"counts: (\{.*?\}) \(source: (summary|job directory)", result.stdout)
    assert [source for _, source in counts] == ["summary", "job directory"], result.stdout
    assert counts[0][0] == counts[1][0] and "'done'" in counts[0][0]
    for form in ("status", "status --json", "status --all", "status --json --all"):
        assert f"`dj-elastic {form}`:" in result.stdout


@pytest.mark.extended  # 4-7 s: in the extended tier, to keep the default suite within its time
def test_gpu_simulate_every_contender_keeps_the_rows():
    result = bench("gpu/simulate.py", "--rows", "200")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r[0]: r for r in table_rows(result.stdout, "| ") if r[0] not in ("contender", "---")}
    assert {"data-juicer-1.6.1", "ours-default"} <= rows.keys(), result.stdout
    assert all(rows[name][11] == "0/0/0/0" for name in rows if name.startswith("ours")), rows


def test_bench_summary_bytes_prints_the_bytes_of_both_reads():
    result = bench("bench_summary_bytes.py", "--workers", "4", "--shards", "100")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout, "| 4 |")
    assert [r[2] for r in rows] == ["random", "runs"], result.stdout
    measured = json.loads(bench("bench_summary_bytes.py", "--workers", "4", "--shards", "100", "--json").stdout)
    assert all(0 < m["brief"] < m["summary"] and m["after_mb_s"] < m["before_mb_s"] for m in measured), measured
