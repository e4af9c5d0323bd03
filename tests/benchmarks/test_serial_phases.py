"""benchmarks/serial_phases.py: the projection of a job's serial ends, on a case computed by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import serial_phases as sp  # noqa: E402


def test_the_projection_on_a_case_computed_by_hand():
    fleet = sp.Fleet(input_gb=100, output_fraction=1.0, nodes=10, cores=4, link_gb_s=1.0, storage_gb_s=100.0,
                     files=100, shards=40)  # fmt: skip
    costs = sp.Costs(prepare_cpu_s_per_gb=4, check_cpu_s_per_gb=2, merge_cpu_s_per_gb=2, work_cpu_s_per_gb=40,
                     plan_op_s=0.001)  # fmt: skip
    result = sp.project(fleet, costs)
    before, parts, file = result.values()
    # 40 cores at 40 CPU-s/GB: 1 GB/s, under the fleet's 10 GB/s of links
    assert before["running"] == parts["running"] == pytest.approx(100)
    # one node: 4 cores at 4 CPU-s/GB, 1 GB/s, its link 1 GB/s; the merge: 2 threads at 2 CPU-s/GB
    assert before["to_first_shard"] == pytest.approx(100) and before["after_last_shard"] == pytest.approx(100)
    # the plan: 140 ops of 1 ms; the scans: 100 GB over the fleet's links (10 GB/s), its cores could do 20
    assert parts["to_first_shard"] == pytest.approx(0.14 + 10)
    assert parts["after_last_shard"] == pytest.approx(40 * 3 * 0.001)
    # the streaming merge (1 GB/s) keeps up with the shards (1 GB/s): nothing left at the end
    assert file["after_last_shard"] == pytest.approx(0)
    assert "| before (prepare, merge) | 100 s | 100 s | 100 s | 5 min | 66.7% |" in sp.table(result)
