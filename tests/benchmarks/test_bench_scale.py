"""benchmarks/bench_scale.py runs end to end at a small size: every section reports counts, and
every count the scale model reads is there and non-zero (no timing is asserted)."""

from __future__ import annotations


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
    # summary they must not (the scale model's table is checked in test_scale_model.py).
    few, more = small_scale_bench["result"]["idle"]
    if small_scale_bench["result"]["protocol"] == "walk":
        assert more["idle_poll_ops_median"] > few["idle_poll_ops_median"]
        assert more["gate_ops_median"] > few["gate_ops_median"]
    else:  # the summary: a poll reads summary.seq (and the summary when it changed), the gate nothing
        # (a poll may walk, when the summary was late on this loaded machine: medians, not maxima)
        assert more["idle_poll_ops_median"] <= 2 and more["gate_ops_median"] == few["gate_ops_median"] == 0
