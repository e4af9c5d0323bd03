"""The benchmarks that start `dj-process`, `dj-elastic` and Ray run end to end at a tiny size (their
numbers mean nothing here; the point is that the commands in benchmarks/README.md keep working against
the package and keep reporting what they promise).  Each starts Data-Juicer and Ray several times:
tens of seconds to minutes on a 2-core machine, so they are in the extended tier, except the check of
bench_sharded's shard split (in-process, no Ray)."""

from __future__ import annotations

import importlib.util
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


def _bench_sharded():
    spec = importlib.util.spec_from_file_location("bench_sharded", REPO / "benchmarks" / "bench_sharded.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_sharded_splits_a_planned_job_into_the_input_rows_in_order(tmp_path):
    """Variant (c)'s split of a job as `dj-elastic prepare` leaves it (planned, not scanned): the split
    scans it and writes each shard's rows."""
    from data_juicer_elastic.shards.prepare import PrepareRequest, plan_job

    sharded = _bench_sharded()
    data = sharded.write_dataset(tmp_path / "input.jsonl", 120)
    plan_job(PrepareRequest(job_dir=tmp_path / "job", dataset_path=data, num_shards=3, recipe={}, stage_identities=[]))
    assert not (tmp_path / "job" / "manifest.json").exists()
    files = sharded.split_shards(tmp_path / "job", tmp_path / "shards")
    assert len(files) == 3 and all(f.stat().st_size > 0 for f in files.values())
    assert b"".join(f.read_bytes() for f in files.values()) == data.read_bytes()


@pytest.mark.extended
def test_bench_sharded_one_round_with_the_phases_of_the_elastic_run(tmp_path):
    result = bench("bench_sharded.py", "--rows", "200", "--workdir", str(tmp_path), "--skip-cold", "--rounds", "1")
    assert "elastic_8 / plain_ray = " in result.stdout and "added cost per extra shard" in result.stdout
    assert "elastic_8 phases: config_and_prepare" in result.stdout, result.stdout
    median = json.loads((tmp_path / "results.json").read_text())["median"]
    assert {"plain_ray", "elastic_8", "elastic_4", "elastic_32", "elastic_8_first_shard"} <= median.keys()


@pytest.mark.extended
def test_bench_cli_times_prepare_and_merge_both_ways(tmp_path):
    out = tmp_path / "result.json"
    bench("bench_cli.py", "--workdir", str(tmp_path / "w"), "--size-mb", "1", "--shards", "2", "--repeat", "1",
          "--out", str(out))  # fmt: skip
    data = json.loads(out.read_text())
    assert data["prepare"]["ratio"] > 0 and data["merge"]["ratio"] > 0
    assert data["imports"]["status"] == [] and data["imports"]["verify"] == []  # neither Data-Juicer nor Ray


@pytest.mark.extended
def test_bench_plan_scan_every_section(tmp_path):
    out = tmp_path / "result.json"
    bench("bench_plan_scan.py", "--size-mb", "1", "--job-mb", "1", "--repeat", "1", "--workdir", str(tmp_path / "w"),
          "--out", str(out))  # fmt: skip
    data = json.loads(out.read_text())
    assert data["prepare"]["ratio"] > 0 and data["scan"]["speedup"] > 0
    assert data["job"], data


@pytest.mark.extended
def test_bench_slots_every_variant_finishes_the_job(tmp_path):
    result = bench("bench_slots.py", "--rows", "200", "--shards", "2", "--slots", "2", "--workdir", str(tmp_path))
    variants = {
        line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1])
        for line in result.stdout.splitlines()
        if line.split(" ", 1)[0] in ("seq", "threads", "procs")
    }
    assert variants.keys() == {"seq", "threads", "procs"}, result.stdout
    assert variants["threads"]["done"] == 2 and variants["threads"]["errors"] == "ERRORS []"


@pytest.mark.extended
def test_bench_demo_one_round_same_texts_as_the_default_executor(tmp_path):
    out = tmp_path / "result.json"
    result = bench("bench_demo.py", "--rounds", "1", "--workdir", str(tmp_path / "w"), "--out", str(out))
    assert "same output texts as the default executor: True" in result.stdout, result.stdout
    assert "elastic phases: wall" in result.stdout


@pytest.mark.extended
def test_bench_warm_ops_task_mode_one_load_and_the_input_back(tmp_path):
    out = tmp_path / "result.json"
    bench("bench_warm_ops.py", "--workdir", str(tmp_path / "w"), "--mode", "task", "--shards", "2",
          "--rows-per-shard", "10", "--batch-size", "5", "--batch-secs", "0.05", "--load-secs", "0.1",
          "--json", str(out))  # fmt: skip
    task = json.loads(out.read_text())["task"]
    assert task["output_matches_input"] is True and task["loads_per_process"]["worker"] == 1


@pytest.mark.extended
def test_bench_stragglers_four_instances_share_the_shards(tmp_path):
    result = bench("bench_stragglers.py", "--workdir", str(tmp_path), "--rows-per-shard", "5",
                   "--seconds-per-row", "0.02", "--shards-per-worker", "2")  # fmt: skip
    data = json.loads((tmp_path / "results.json").read_text())
    assert sum(data["shards_by_node"].values()) >= data["num_shards"] == 8
    assert "work-phase makespan / ideal" in result.stdout
