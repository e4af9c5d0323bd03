"""`dj-elastic status` on a synthetic job of 10,000 shards built with the real record writers
(benchmarks/bench_status.py): every fact checked against what was built.  No timing assertions;
the benchmark reports the time."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_juicer_elastic.jobdir.manifest import load_manifest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_status.py"
_spec = importlib.util.spec_from_file_location("bench_status", _PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_status"] = bench
_spec.loader.exec_module(bench)

SHARDS = 10_000


@pytest.fixture(scope="module")
def big_job(tmp_path_factory):
    job = tmp_path_factory.mktemp("status-10k") / "job"
    # 5% claimed (500 shards: done, running, failed, retried), 95% never claimed: keeps the
    # build to seconds; the benchmark builds the 75%-done mix.
    roles = bench.build_job(job, SHARDS, pending_fraction=0.95)
    late = roles["running"][-1]  # its holder stopped writing heartbeats 10 minutes ago
    (beat,) = (job / "heartbeats" / late).iterdir()
    old = time.time() - 600
    os.utime(beat, (old, old))
    return job, roles


def _status(job: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--job-dir", str(job), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.extended
def test_json_facts_match_the_built_job(big_job):
    job, roles = big_job
    proc = _status(job, "--json")
    assert proc.returncode == 2, proc.stderr  # terminal failures
    data = json.loads(proc.stdout)
    assert (data["format"], data["version"]) == ("dj-elastic/status", 1)
    assert data["counts"] == {
        "pending": len(roles["pending"]),
        "running": len(roles["running"]),
        "stale": 0,
        "done": len(roles["done"]),
        "failed": len(roles["failed"]),
    }
    rows = {entry.shard_id: entry.rows for entry in load_manifest(job).shards}  # prepare splits by bytes
    assert data["rows_total"] == SHARDS * bench.ROWS_PER_SHARD == sum(rows.values())
    assert data["rows_done"] == data["output_rows"] == sum(rows[s] for s in roles["done"])
    assert data["retried"] == len(roles["retried"])
    assert len(data["shards"]) == SHARDS

    assert sorted(f["shard_id"] for f in data["failed"]) == sorted(roles["failed"])
    for failed in data["failed"]:
        assert failed["error"] == "ValueError: poison row" and failed["failures"] == bench.MAX_RETRIES + 1
        log = Path(failed["log_path"])
        assert log.name == "process.log" and log.parent.parent == job / "attempts" / failed["shard_id"]
        assert log.parent.is_dir(), "the log path names the last failed attempt's directory"

    # the straggler read nothing in 100 s while its peers read their whole shard; one heartbeat is late
    stragglers = {s["shard_id"]: s for s in data["stragglers"]}
    slow, late = roles["running"][0], roles["running"][-1]
    assert set(stragglers) == {slow, late}
    assert stragglers[slow]["reason"] == "slow" and stragglers[slow]["rows_per_sec"] == 0.0
    rates = sorted(rows[s] / 100.0 for s in roles["running"][1:]) + [0.0]
    assert stragglers[slow]["median_rows_per_sec"] == pytest.approx(sorted(rates)[len(rates) // 2], abs=0.006)
    assert stragglers[late]["reason"] == "heartbeat-late" and stragglers[late]["heartbeat_age_secs"] >= 590

    running = [s for s in data["shards"] if s["state"] == "running"]
    assert all(s["progress"]["stage"] == "processing" for s in running)
    in_progress = sum(rows[s] for s in roles["running"][1:])
    assert data["rows_in_progress"] == in_progress
    assert data["rows_per_sec"] == pytest.approx(in_progress / 100.0, abs=1e-3)
    remaining = data["rows_total"] - data["rows_done"] - in_progress - sum(rows[s] for s in roles["failed"])
    assert data["eta_secs"] == pytest.approx(remaining / (in_progress / 100.0), rel=1e-3)

    nodes = {n["node_id"]: n for n in data["nodes"]}
    assert len(nodes) == bench.NODES
    assert sum(n["shards_done"] for n in nodes.values()) == len(roles["done"])
    assert sum(n["running"] for n in nodes.values()) == len(running)
    assert sum(n["rows_per_sec"] for n in nodes.values()) == pytest.approx(data["rows_per_sec"], abs=1e-2)


@pytest.mark.extended
def test_text_lists_what_needs_attention_and_all_lists_every_shard(big_job):
    job, roles = big_job
    proc = _status(job)
    assert proc.returncode == 2, proc.stderr
    text = proc.stdout
    assert f"done {len(roles['done'])}" in text and f"failed {len(roles['failed'])}" in text
    assert "stragglers:" in text and f"{roles['running'][0]} node=" in text and "heartbeat late" in text
    assert all(shard in text for shard in roles["failed"]) and "log: " in text
    assert "ETA " in text and "rows/s now" in text
    assert roles["done"][0] not in text and roles["pending"][0] not in text
    full = _status(job, "--all").stdout
    assert sum(1 for line in full.splitlines() if line.startswith("  part-")) >= SHARDS
    assert roles["done"][0] in full and roles["pending"][-1] in full
