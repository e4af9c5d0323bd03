"""The I/O benchmarks run end to end at a tiny size (their numbers mean nothing here; the
point is that the commands in benchmarks/README.md keep working and keep checking bytes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not all(__import__("shutil").which(t) for t in ("zstd", "gzip")), reason="needs zstd and gzip")
def test_bench_io_runs_every_section_and_reports_ratios_and_the_floor(tmp_path):
    out = tmp_path / "result.json"
    command = [sys.executable, str(REPO / "benchmarks" / "bench_io.py"), "--workdir", str(tmp_path / "w")]
    command += ["--size-gb", "0.004", "--repeat", "1", "--shards", "3", "--keep-page-cache", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["page_cache_dropped"] is False
    for section in ("prepare", "merge", "prepare_zstd", "prepare_gzip"):
        assert all(r > 0 for r in data[section]["ratios"].values()), section
    assert data["floor"]["prepare_cpu_s"] > 2 * data["floor"]["cpu_s"]["sha256"] > 0
    assert "warm-up, dropped" in result.stdout


def test_bench_preallocate_runs_both_sides(tmp_path):
    command = [sys.executable, str(REPO / "benchmarks" / "bench_preallocate.py"), "--workdir", str(tmp_path)]
    result = subprocess.run(
        command + ["--size-gb", "0.02", "--rounds", "1"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reserve=False: median" in result.stdout and "reserve=True: median" in result.stdout
    assert not (tmp_path / "out.bin").exists()


def test_bench_stats_runs_both_measurements(tmp_path):
    command = [sys.executable, str(REPO / "benchmarks" / "bench_stats.py"), "--rows", "500", "--shards", "5"]
    result = subprocess.run(command + ["--repeat", "1"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "-> ratio" in result.stdout and "finalize stats for 5 shards" in result.stdout
