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


@pytest.mark.extended  # 4-7 s: in the extended tier, to keep the default suite within its time
def test_adaptive_batching_prints_every_controller_of_each_scenario_and_no_silent_loss():
    result = bench("adaptive_batching.py", "--rows", "500", "--seeds", "1", "--scenarios", "stationary", "poison")
    assert result.returncode == 0, result.stderr[-3000:]
    for scenario in ("stationary", "poison"):
        rows = {r[1]: r for r in table_rows(result.stdout, f"| {scenario} |")}
        assert {"data-juicer-1.6.1", "ours", "ours-rows"} <= rows.keys(), result.stdout
        assert all(rows[name][9] == "0/0/0/0" for name in ("ours", "ours-rows")), rows  # lost/dup/reordered/mismatch


def test_bench_claims_every_shard_claimed_once(tmp_path):
    result = bench(
        "bench_claims.py", "--workdir", str(tmp_path), "--workers", "2", "--shards", "20", "--baseline-rev", "",
        "--settle", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (after,) = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert after["variant"] == "after" and after["claims"] == 20 and sum(after["shards_by_worker"]) == 20
    assert after["claim_path_ops_per_claim"] > 0


def test_bench_export_runs_both_sections(tmp_path):
    out = tmp_path / "result.json"
    result = bench(
        "bench_export.py", "--workdir", str(tmp_path / "w"), "--sizes-mb", "1", "--shards", "3", "--repeat", "1",
        "--stream-mb", "1", "--stream-shards", "2", "--shard-secs", "0.1", "--stream-rounds", "1", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["parts"]["ratios"]["parts_over_full_merge_1mb"] > 0
    assert data["stream"]["median"]["streamed_over_last_shard"] > 0
    assert "parts ratios:" in result.stdout and "stream medians:" in result.stdout


def test_bench_fault_seam_measures_the_seam():
    result = bench("bench_fault_seam.py", "--shards", "5", "--repeat", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(re.search(r"seam calls per shard:\s+([\d.]+)", result.stdout).group(1)) > 0
    assert "unused seam / shard's job-dir work" in result.stdout


def test_bench_quarantine_reports_each_operator_call():
    result = bench("bench_quarantine.py", "--rows", "300", "--rounds", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(re.findall(r"ratio \d+\.\d+", result.stdout)) == 4, result.stdout


def test_bench_row_schema_reports_both_row_shapes():
    result = bench("bench_row_schema.py", "--rows", "300", "--repeat", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    for shape in ("flat", "nested"):
        assert re.search(rf"{shape}\s*: parse [\d.]+ us/row, observe [\d.]+ us/row", result.stdout), result.stdout


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


@pytest.mark.extended  # 4-7 s: in the extended tier, to keep the default suite within its time
def test_gpu_adaptive_smoke_refuses_clearly_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the smoke test itself is the GPU run")
    result = bench("gpu_adaptive_smoke.py", "--rows", "10")
    assert result.returncode == 2 and "needs a GPU" in result.stderr, result.stderr[-3000:]


def test_bench_summary_bytes_prints_the_bytes_of_both_reads():
    result = bench("bench_summary_bytes.py", "--workers", "4", "--shards", "100")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout, "| 4 |")
    assert [r[2] for r in rows] == ["random", "runs"], result.stdout
    measured = json.loads(bench("bench_summary_bytes.py", "--workers", "4", "--shards", "100", "--json").stdout)
    assert all(0 < m["brief"] < m["summary"] and m["after_mb_s"] < m["before_mb_s"] for m in measured), measured
