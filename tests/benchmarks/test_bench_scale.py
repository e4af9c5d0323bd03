"""benchmarks/bench_scale.py runs end to end at a small size: every section reports counts, and
every count the scale model reads is there and non-zero (no timing is asserted)."""

from __future__ import annotations


def test_every_section_reports_counts(small_scale_bench):
    data, stdout = small_scale_bench["result"], small_scale_bench["stdout"]
    assert data["protocol"] in ("walk", "summary")
    assert [c["claim_ahead"] for c in data["claims"]] == [True, False]
    for c in data["claims"]:
        assert c["shards"] == 48 and c["workers"] == 4
        assert c["claims"] >= 48 and c["claim_next_calls"] >= c["claims"]
        assert c["claim_path_ops_per_claim"] > 0 and c["run_ops_per_shard"] > 0
        assert c["beats"] >= 48 and c["heartbeat_ops_per_beat"] > 0
        assert set(c["ops_by_activity"]) >= {"claim", "run", "heartbeat", "shard"}
    assert [i["held"] for i in data["idle"]] == [2, 6]
    for i in data["idle"]:
        assert i["shards"] == 24 and i["done"] == 24 - i["held"] and i["idle_claimed"] == 0
        assert i["idle_polls"] == 6 and i["idle_poll_ops_median"] > 0 and i["idle_first_poll_ops"] > 0
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
        assert more["status_ops"] > few["status_ops"]
    else:
        assert more["idle_poll_ops_median"] == few["idle_poll_ops_median"]
