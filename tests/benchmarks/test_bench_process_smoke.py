"""The benchmarks that start `dj-process`, `dj-elastic` and Ray run end to end at a tiny size (their
numbers mean nothing here; the point is that the commands in benchmarks/README.md keep working against
the package and keep reporting what they promise).  Each starts Data-Juicer and Ray several times:
tens of seconds to minutes on a 2-core machine, so they are in the extended tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def bench(script: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "benchmarks" / script), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


@pytest.mark.extended
def test_bench_sharded_one_round_against_both_executors_with_the_same_texts(tmp_path):
    result = bench("bench_sharded.py", "--rows", "200", "--workdir", str(tmp_path), "--shards", "2", "4")
    assert "same output texts as the default executor: True" in result.stdout, result.stdout
    assert "same output texts as the ray executor: True" in result.stdout, result.stdout
    assert "elastic_2 phases: config_and_prepare" in result.stdout, result.stdout
    median = json.loads((tmp_path / "results.json").read_text())["median"]
    assert {"elastic_2 / default", "elastic_2 / ray", "per_extra_shard"} <= median.keys(), median


@pytest.mark.extended
def test_bench_warm_ops_task_mode_one_load_and_the_input_back(tmp_path):
    out = tmp_path / "result.json"
    bench("bench_warm_ops.py", "--workdir", str(tmp_path / "w"), "--mode", "task", "--shards", "2",
          "--rows-per-shard", "10", "--batch-size", "5", "--batch-secs", "0.05", "--load-secs", "0.1",
          "--json", str(out))  # fmt: skip
    task = json.loads(out.read_text())["task"]
    assert task["output_matches_input"] is True and task["loads_per_process"]["worker"] == 1


@pytest.mark.extended
def test_bench_dedup_job_keeps_the_default_executors_rows_and_reports_the_phases(tmp_path):
    result = bench("bench_dedup_job.py", "--rows", "300", "--shards", "3", "--workdir", str(tmp_path))
    assert "same rows (ids, in order): True; same values: True" in result.stdout, result.stdout
    assert "dedup1_signatures" in result.stdout and "elastic / default" in result.stdout, result.stdout
    found = json.loads((tmp_path / "results.json").read_text())
    (first,) = found["rounds"]
    assert first["kept_default"] == first["kept_elastic"] < 300, first
    assert {"dedup1_signatures", "dedup1_buckets", "dedup1_cluster", "shards"} <= first["phases"].keys(), first
    assert {"compute_hash", "process"} <= first["default_phases"].keys(), first
    assert found["median"]["elastic / default"] > 0
