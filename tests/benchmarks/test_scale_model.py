"""benchmarks/bench_scale.py at a small size (every section reports counts, and every count the scale
model reads is there and non-zero; no timing is asserted) and the scale model (benchmarks/scale_model.py):
its op table against those counts of the real worker loop, a hand-computed single worker, and the
failure paths (a dead holder, a dead summary writer).  One file, so the bench runs once per test
process (the test files are spread over processes file by file)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "scale_model.py"
_spec = importlib.util.spec_from_file_location("scale_model", _PATH)
sm = importlib.util.module_from_spec(_spec)
sys.modules["scale_model"] = sm
_spec.loader.exec_module(sm)


def test_op_table_matches_the_benchmarks_counts(small_scale_bench):
    """Every entry of the table the model simulates with, for the protocol the code runs (the
    summary, or the walk it falls back to), is what bench_scale.py counted on the real worker
    loop: claims, a shard's records, first beats and renewals with the progress flush, how the
    idle poll, the gate, status and a stopped worker's exit grow with the live claims, and (on the
    summary) the writer's round and the other keepers' look.  Where the code does not do what the
    model charges (``sm.GAPS``), the check may say so; any other difference fails."""
    bench = small_scale_bench["result"]
    rows = sm.check_ops(bench)
    assert len(rows) == len(sm.expectations(bench["protocol"])) == (11 if bench["protocol"] == "summary" else 9)
    wrong = {name: (model, measured) for name, model, measured, ok in rows if not ok}
    if bench["protocol"] == "summary":  # a gap may not show at a small size (a walking poll is timing)
        assert set(wrong) <= set(sm.GAPS), wrong
    else:
        assert not wrong, f"protocol walk: model vs measured: {wrong}"


def test_the_measured_table_drives_the_model(small_scale_bench):
    bench = small_scale_bench["result"]
    ops = sm.ops_from_bench(bench)
    measured = sm.measured_ops(bench)
    assert ops["run"] == measured["run"]
    key = "first_beat" if bench["protocol"] == "summary" else "walk_heartbeat"
    assert ops[key] == measured["first_beat"]
    r = sm.simulate(sm.Params(workers=3, shards=30, shard_secs=5.0, fail_fraction=0.0, ttl_s=8.0, poll_s=0.5, ops=ops))
    assert r.done_shards == 30


def _one_worker(shards: int) -> sm.Result:
    return sm.simulate(
        sm.Params(
            workers=1,
            shards=shards,
            nas_ops_per_s=1e9,
            shard_secs=10.0,
            shard_sigma=0.0,
            speed_sigma=0.0,
            fail_fraction=0.0,
            start_spread_s=0.0,
            claim_ahead=False,
            gate=False,
            keeper_phase=False,
        )  # fmt: skip
    )


def test_hand_computed_single_worker():
    r = _one_worker(4)
    o = sm.OPS
    # it joins before the first summary: reads summary.seq (nothing yet) and polls 2 s later; then
    # each claim: seq, probe, publication, pace record (its keeper read the summary meanwhile)
    claim = o["seq_read"] + o["claim_probe"] + o["claim_publish"] + o["pace_write"]
    assert r.claims == 4 and r.lost_races == 0 and r.done_shards == 4
    assert r.claim_ops_mean == pytest.approx(claim)
    assert r.ops_by_kind["claim"] == pytest.approx(o["seq_read"] + 4 * claim)
    # each shard: the first heartbeat, then its records (its pace goes out with the next claim's write)
    assert r.ops_by_kind["run"] == pytest.approx(4 * (o["first_beat"] + o["run"]))
    first_look = 0.001 * o["seq_read"]  # 1 ms per op; the poll is 2 s after it
    assert r.makespan_s == pytest.approx(first_look + 2.0 + 4 * 10.0 + 0.001 * 4 * (claim + o["first_beat"] + o["run"]))
    # the writer: lists, the worker's pace record, the live claim's heartbeat (one, while it runs), writes
    per_cycle = o["writer_lists"] + o["writer_per_worker"] + o["writer_writes"] + o["writer_fence"]
    cycles = r.ops_by_kind["writer"] // per_cycle
    assert 8 <= cycles <= 10 and r.ops_by_kind["writer"] <= cycles * (per_cycle + o["writer_per_claim"])
    # the keeper looks at the summary once per interval: summary.seq and the summary (it changed)
    looks = (o["seq_read"] + o["summary_read"]) * r.makespan_s / 5.0
    assert r.ops_by_kind["keeper"] == pytest.approx(looks, rel=1e-3)


def test_a_dead_holders_shard_is_taken_over_and_the_job_finishes():
    p = sm.Params(workers=5, shards=60, shard_secs=5.0, fail_fraction=0.2, ttl_s=8.0, poll_s=0.5, summary_s=1.0)
    r = sm.simulate(p)
    assert r.deaths == 1 and r.done_shards == 60 and r.takeovers >= 1
    assert r.makespan_s >= r.bound_s * 0.99 and "| 5 | 60 |" in sm.row(r)


def test_a_dead_summary_writer_makes_the_workers_walk_until_a_new_one_writes():
    p = sm.Params(workers=4, shards=400, shard_secs=2.0, fail_fraction=0.0, ttl_s=8.0, poll_s=0.5, summary_s=1.0)
    calm = sm.Sim(p)
    calm.run()
    p.writer_dies_at = 0.3
    sim = sm.Sim(p)
    r = sim.run()
    assert r.done_shards == 400 and calm.fallback_claims == 0 < sim.fallback_claims
    assert r.summary_age_max_s >= p.ttl_s


def test_status_reads_grow_with_nodes_and_running_attempts_only():
    small = sm.simulate(sm.Params(workers=3, shards=30, shard_secs=5.0, fail_fraction=0.0, ttl_s=8.0))
    big = sm.simulate(sm.Params(workers=3, shards=300, shard_secs=5.0, fail_fraction=0.0, ttl_s=8.0))
    o = sm.OPS
    assert small.status_ops == big.status_ops == o["status_base"] + 3 * (o["status_per_node"] + o["status_per_running"])


def test_summary_reads_stay_under_10_mb_s_at_1000_workers_and_100k_shards():
    """The bytes every worker reads of the summary per round, from a round built and encoded by the
    package's own record classes (benchmarks/bench_summary_bytes.py), with the done set scattered
    at random (an incompressible bitmap): bytes per read x reads/s x workers.  Before the brief
    every worker read summary.json, about 20 times as much."""
    bench = sm._bench_summary_bytes()
    sizes = bench.measure(1000, 100_000, "random")
    assert sizes.after_mb_s() <= 10.0 < sizes.before_mb_s(), sizes
    assert sizes.brief * 10 < sizes.summary
    # the model's note charges the same bytes at the read rate it simulates
    r = sm.simulate(sm.Params(workers=20, shards=400, shard_secs=5.0, fail_fraction=0.0, ttl_s=8.0))
    before, after, summary, brief = sm.summary_read_rates(r)
    assert 0 < after < before and brief < summary and "MB/s" in sm.summary_bytes_note(r)


def test_every_section_reports_counts(small_scale_bench):
    data, stdout = small_scale_bench["result"], small_scale_bench["stdout"]
    assert data["protocol"] in ("walk", "summary")
    assert [c["claim_ahead"] for c in data["claims"]] == [True, False]
    for c in data["claims"]:
        assert c["shards"] == 96 and c["workers"] == 4
        assert c["claims"] >= 96 and c["claim_next_calls"] >= c["claims"]
        assert c["claim_path_ops_per_claim"] > 0 and c["run_ops_per_shard"] > 0
        assert c["beats"] >= 96 and c["heartbeat_ops_per_beat"] > 0
        assert set(c["ops_by_activity"]) >= {"claim", "run", "heartbeat", "shard"}
    if data["protocol"] == "summary":  # the job summary was written, and its writer's rounds counted
        assert all(c["summary_written"] and c["writer_rounds"] > 0 for c in data["claims"])
        assert all(i["writer_round_ops"] > 0 and i["other_round_ops"] > 0 for i in data["idle"])
    assert [i["held"] for i in data["idle"]] == [2, 6]
    for i in data["idle"]:
        assert i["shards"] == 24 and i["done"] == 24 - i["held"] and i["idle_claimed"] == 0
        assert i["idle_polls"] == 6 and i["idle_first_poll_ops"] > 0  # later polls: 0 ops when the keeper just looked
        assert i["status_ops"] > 0 and i["status_json_ops"] > 0 and i["settle_ops_per_poll"] > 0
        assert len(i["gate_ops"]) == 8 and i["holder_beats"] > 0 and i["heartbeat_ops_per_beat"] > 0
    assert [s["held"] for s in data["status"]] == [0, 2, 6]
    assert "| claims: W x S |" in stdout and "| live claims held |" in stdout and "| status: shards |" in stdout


def test_live_claims_cost_the_idle_poll_and_status_more_on_the_walk(small_scale_bench):
    # Without the job summary an idle worker reads each live claim's done marker per poll and
    # status reads each running attempt's records: both grow with the live claims.  With the
    # summary they must not (the scale model's table is checked below).
    few, more = small_scale_bench["result"]["idle"]
    if small_scale_bench["result"]["protocol"] == "walk":
        assert more["idle_poll_ops_median"] > few["idle_poll_ops_median"]
        assert more["gate_ops_median"] > few["gate_ops_median"]
    else:  # the summary: a poll reads summary.seq (and the summary when it changed), the gate nothing
        # (a poll may walk, when the summary was late on this loaded machine: medians, not maxima)
        assert more["idle_poll_ops_median"] <= 2 and more["gate_ops_median"] == few["gate_ops_median"] == 0
