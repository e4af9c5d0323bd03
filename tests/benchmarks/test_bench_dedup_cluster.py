"""benchmarks/bench_dedup_cluster.py at a tiny size: it runs the real cluster step on its edge files and
prints the numbers it promises (their values mean nothing at this size)."""

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
