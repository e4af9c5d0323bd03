"""The scale model (benchmarks/scale_model.py): a tiny case, hand-computed op counts, and its
per-step op table against a traced run of the real worker loop."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

from data_juicer_elastic.jobdir import worker_loop
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.worker_settings import WorkerSettings
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.sharedfs import fault_seam
from tests.jobdir.conftest import copy_runner, identity, make_rows, request, write_rows

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "scale_model.py"
_spec = importlib.util.spec_from_file_location("scale_model", _PATH)
sm = importlib.util.module_from_spec(_spec)
sys.modules["scale_model"] = sm
_spec.loader.exec_module(sm)

WEIGHT = {"makedirs": 3, "write": 0}  # the model's unit: one fsio call; makedirs is 3 syscalls


def _one_worker(shards: int, gate: bool, protocol: str = "scan") -> sm.Result:
    return sm.simulate(
        sm.Params(
            workers=1,
            shards=shards,
            latency_s=0.001,
            nas_ops_per_s=1e9,
            shard_secs=10.0,
            shard_sigma=0.0,
            speed_sigma=0.0,
            fail_fraction=0.0,
            start_spread_s=0.0,
            gate=gate,
            protocol=protocol,
        )
    )


def test_hand_computed_single_worker_without_gate():
    r = _one_worker(4, gate=False)
    # claim k passes k done markers (1 op each), reads the pending target (5), publishes (10)
    assert r.claim_ops_mean == pytest.approx(sum(k + 15 for k in range(4)) / 4)
    claim_ops = sum(k + 15 for k in range(4))  # 66
    run_ops = 4 * (17 + 32)  # run_end includes the final progress.json write
    exit_ops = 3 * 4  # last claim_next pass, job_outcome twice
    assert r.claims == 4 and r.done_shards == 4 and r.lost_races == 0
    foreground = sum(v for k, v in r.ops_by_kind.items() if k != "background")
    assert foreground == pytest.approx(claim_ops + run_ops + exit_ops)
    assert r.makespan_s == pytest.approx(4 * 10.0 + 0.001 * (claim_ops + run_ops))
    assert r.claim_latency_p99_s == pytest.approx(0.001 * 18)  # the last claim: 3 + 15 ops
    assert r.all_exited_s == pytest.approx(r.makespan_s + 0.001 * exit_ops)


def test_hand_computed_gate_reads_every_shard():
    r = _one_worker(3, gate=True)
    # observe() before claim k: k done (2 each) + (3 - k) pending (4 each)
    gate = sum(2 * k + 4 * (3 - k) for k in range(3))  # 12 + 10 + 8
    claims = sum(k + 15 for k in range(3)) + 3  # + the final pass that finds every shard done
    assert r.ops_by_kind["claim gate"] == pytest.approx(gate)
    assert r.ops_by_kind["claim scan"] + r.ops_by_kind["claim publish"] == pytest.approx(claims)


def test_hand_computed_single_worker_with_the_claim_cursor():
    r = _one_worker(4, gate=False, protocol="cursor")
    ops = sm.OPS
    # one done/ listing, then each claim probes its (pending) shard and publishes; nothing
    # is re-read, and at the exit job_outcome skips the 4 markers the worker parsed itself
    claim_ops = ops["cursor_listing"] + 4 * (ops["cursor_probe_pending"] + ops["claim_publish"])
    assert r.claims == 4 and r.lost_races == 0
    assert r.claim_ops_mean == pytest.approx(claim_ops / 4)
    foreground = sum(v for k, v in r.ops_by_kind.items() if k != "background")
    assert foreground == pytest.approx(claim_ops + 4 * (ops["run_start"] + ops["run_end"]))
    assert r.all_exited_s == pytest.approx(r.makespan_s)


def _traced_worker_ops(tmp_path: Path, *, claim_ahead: bool) -> int:
    """Weighted file-system ops of a real worker loop over a fresh 3-shard job."""
    data = write_rows(tmp_path / "in.jsonl", make_rows(30))
    job = tmp_path / "job"
    prepare_job(request(job, data, 3, copy_shards=True))  # the table counts a copied shard's file check
    layout, manifest = JobLayout(job), load_manifest(job)
    from data_juicer_elastic.coordination.stragglers import ClaimGate

    trace: list[str] = []
    fault_seam.set_fault_hook(lambda op, path: trace.append(op))
    try:
        # a clock that jumps 1000 s per look: every claim finds the gate's answer expired
        clock = itertools.count(0.0, 1000.0).__next__
        gate = ClaimGate(layout, manifest, "node-a", 1, min_interval=0.0, max_read_share=None, clock=clock)
        worker_loop.run_worker(
            job,
            identity(),
            copy_runner(),
            WorkerSettings(
                ttl_secs=1000.0,
                heartbeat_secs=100.0,  # only the first beat (part of run_start)
                max_retries=3,
                poll_interval_secs=0.01,
                claim_ahead=claim_ahead,
            ),
            claim_gate=gate,
        )
    finally:
        fault_seam.set_fault_hook(None)
    return sum(WEIGHT.get(op, 1) for op in trace)


def test_op_table_matches_the_real_worker_loop(tmp_path):
    # The table models the claim path; claim-ahead (below) moves a claim off the boundary and adds
    # a few ops per shard of its own.
    real = _traced_worker_ops(tmp_path / "plain", claim_ahead=False)
    ahead = _traced_worker_ops(tmp_path / "ahead", claim_ahead=True)
    # Per shard claimed ahead: its lease's first beat (the run's heartbeater beats again when it
    # takes over) and, at take(), the lease and input-file checks: bounded, whatever the job size.
    assert 0 <= ahead - real <= 3 * 10, (real, ahead)
    ops = sm.OPS
    runs = 3 * (ops["run_start"] + ops["run_end"])
    # The claim cursor (sm.CursorSim): one done/ listing, then per claim one probe of a
    # pending shard and the publication; the final call knows every shard is done (0 ops)
    # and job_outcome skips the markers this worker parsed (its own: all 3).
    claims = ops["cursor_listing"] + 3 * (ops["cursor_probe_pending"] + ops["claim_publish"])
    # The gate before each claim: its two listings, plus the duration of each shard done
    # since its last call (shard 0 before claim 2, shard 1 before claim 3); it answers yes
    # from the listings alone (never-claimed shards outnumber what the others could take).
    gates = 3 * ops["gate_listings"] + 2 * ops["gate_new_span"]
    # + the manifest read + one listing of shards/, + the fake runner's own read of each shard
    assert real == 2 + claims + gates + runs + 3
    # The walk from shard 0 before the cursor (sm.Sim, protocol "scan") is an upper bound.
    model_claims = sum(k * ops["scan_done"] + ops["scan_pending"] + ops["claim_publish"] for k in range(3))
    model_gates = sum(k * ops["gate_done"] + (3 - k) * ops["gate_pending"] for k in range(3))
    assert real < 2 + model_claims + model_gates + runs + 3 + 3 * 3


def test_all_cases_shape():
    r = sm.simulate(sm.Params(workers=5, shards=40, shard_secs=5.0, fail_fraction=0.2, ttl_s=8.0, poll_s=0.5))
    assert r.done_shards == 40 and r.claims >= 40 and r.takeovers <= r.deaths == 1
    assert r.makespan_s >= r.ideal_s * 0.5 and "| 5 | 40 |" in sm.row(r)
    assert sm.status_ops(10, done=10) == 1 + 10 * sm.OPS["status_done"]
