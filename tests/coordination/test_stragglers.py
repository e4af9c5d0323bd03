"""Straggler avoidance: the pure policy, and the gate over a real job directory."""

from __future__ import annotations

import time

from data_juicer_elastic.coordination.stragglers import ClaimGate, observe, should_claim
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.prepare import prepare_job
from data_juicer_elastic.jobdir.worker_loop import run_worker

from ..jobdir.conftest import copy_runner, identity, make_rows, request, write_rows


def test_equal_speeds_never_decline():
    assert all(should_claim(10.0, [10.0] * n, p) for n in range(1, 8) for p in range(1, 5))


def test_a_4x_slower_node_leaves_the_last_shards_to_fast_ones():
    fast = [12.0, 12.0, 24.0]  # two fast workers and a 2x one are running
    assert not should_claim(48.0, fast, 3)  # they finish 3 pending shards before it finishes one
    assert should_claim(48.0, fast, 8)  # plenty left: it helps
    assert should_claim(48.0, [], 1), "nobody else running: always claim"
    assert should_claim(None, fast, 1), "no estimate yet: claim"


def test_a_2x_slower_node_declines_only_the_very_last_shard():
    assert not should_claim(24.0, [12.0], 1)
    assert should_claim(24.0, [12.0], 2)


def test_the_gate_counts_only_live_claims_of_other_workers(tmp_path):
    job = tmp_path / "job"
    prepare_job(request(job, write_rows(tmp_path / "in.jsonl", make_rows(40)), 4))

    def slow(task):
        time.sleep(0.05)
        return copy_runner()(task)

    run_worker(job, identity("slow"), slow, ttl_secs=60, heartbeat_secs=10, max_retries=0, poll_interval_secs=0.1)
    pace = observe(JobLayout(job), load_manifest(job))
    assert pace.pending == 0 and pace.running == [] and pace.secs_by_node["slow"] > 0.04
    gate = ClaimGate(JobLayout(job), load_manifest(job), "slow", 1, min_interval=0)
    assert gate(), "nobody else is running: never decline"
