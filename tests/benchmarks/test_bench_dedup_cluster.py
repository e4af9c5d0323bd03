"""benchmarks/bench_dedup_cluster.py and bench_dedup_phases.py at a tiny size: they run the real phases
and print the numbers they promise (their values mean nothing at this size)."""

from __future__ import annotations

import json

from tests.benchmarks.test_bench_inprocess_smoke import bench, table_rows


def test_bench_dedup_cluster_prints_time_memory_and_the_projection():
    result = bench(
        "bench_dedup_cluster.py", "--rows", "5000", "--edges", "4000", "--shards", "7", "--files", "3", "--json"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = table_rows(result.stdout, "| 5,000 |")
    assert row[2] == "random" and "GiB" in row[6] and "min" in row[7], result.stdout
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0 < found["edges_in_files"] <= 4000  # duplicates drawn at random are written once
    assert found["rounds"] >= 1 and found["edges_read"] >= found["edges_in_files"]
    assert 0 < found["dropped"] < 5000 and found["projected_label_bytes_1b_rows"] == 4 * 10**9


def test_bench_dedup_phases_keeps_the_rows_data_juicer_keeps():
    result = bench("bench_dedup_phases.py", "--rows", "600", "--unique", "60", "--shards", "3", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (ours,) = table_rows(result.stdout, "| ours |")
    assert ours[4] == "True" and "cluster" in ours[2], result.stdout
    assert table_rows(result.stdout, "| Data-Juicer process |")[0][3] == ours[3]


def test_bench_dedup_datatrove_compares_the_kept_rows_and_keeps_data_juicers():
    """Only where datatrove is importable (a benchmark-only dependency: benchmarks/README.md)."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("datatrove") is None:
        pytest.skip("datatrove is not installed (benchmarks/README.md: a benchmark-only dependency)")
    result = bench("bench_dedup_datatrove.py", "--rows", "600", "--shards", "3", "--check-default", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (ours,) = table_rows(result.stdout, "| ours |")
    (theirs,) = table_rows(result.stdout, "| datatrove |")
    assert "cluster" in ours[2] and "filter" in theirs[2], result.stdout
    assert "ours keeps exactly the rows Data-Juicer's process keeps: True" in result.stdout
    assert "kept by both" in result.stdout and "x;" in result.stdout
