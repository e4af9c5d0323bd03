"""Per-shard summaries through the real worker loop, canonical writer hook and result records
(a Ray-free runner), merged by finalize's code without reading the merged file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from data_juicer_elastic.jobdir.records import ShardResult
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.stats import compute_overall, write_overall_stats
from data_juicer_elastic.stats.columns import ALPHA

from ..jobdir.conftest import identity, request, write_rows
from ..rayfree import rayfree_runner

STATS = "__dj__stats__"
LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=1.0, max_retries=0)


@pytest.fixture
def finished_job(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    rows = [
        {"id": i, "text": "t", STATS: {"text_len": int(n), "ratio": float(r), "lang": ["en", "zh"][i % 3 == 0]}}
        for i, (n, r) in enumerate(zip(rng.integers(5, 5000, 300), rng.random(300), strict=True))
    ]
    data = write_rows(tmp_path / "data" / "input.jsonl", rows)
    job = tmp_path / "job"
    prepare_job(request(job, data, 5))
    summary = run_worker(job, identity(), rayfree_runner(job), WorkerSettings(**LEASE))
    assert summary.complete
    return job


def _done(job: Path) -> list[ShardResult]:
    return [ShardResult.parse(p.read_bytes(), p) for p in sorted((job / "done").iterdir())]


def _assert_matches_pandas(body: dict, merged: Path) -> None:
    stats_file = merged.with_name(merged.name.replace(".jsonl", "_stats.jsonl"))  # Data-Juicer's layout
    frame = pd.DataFrame([json.loads(line)[STATS] for line in stats_file.open()])
    assert all(STATS not in json.loads(line) for line in merged.open()), "stats leave the rows by default"
    columns = {c["name"]: c for c in body["columns"]}
    assert list(columns) == list(frame.columns)
    for name in ("text_len", "ratio"):
        want = frame[name].describe()
        got = columns[name]
        assert got["count"] == want["count"] and (got["min"], got["max"]) == (want["min"], want["max"])
        assert got["mean"] == pytest.approx(want["mean"], rel=1e-12)
        assert got["std"] == pytest.approx(want["std"], rel=1e-12)
        exact = np.sort(frame[name].to_numpy(dtype=float))
        for label in ("25%", "50%", "75%"):
            h = float(label[:-1]) / 100 * (len(exact) - 1)
            lo, hi = exact[int(np.floor(h))], exact[int(np.ceil(h))]
            assert abs(got[label] - want[label]) <= ALPHA * max(abs(lo), abs(hi)) + 1e-12
    want = frame["lang"].describe()
    assert [columns["lang"][k] for k in ("count", "unique", "top", "freq")] == list(want)


def test_summaries_ride_with_results_and_finalize_merges_them_without_the_merged_file(finished_job, tmp_path):
    results = _done(finished_job)
    assert all(r.stats and r.stats_sha256 for r in results)
    overall = compute_overall(finished_job)
    assert overall.body["summaries_recomputed"] == [] and overall.body["rows"] == 300
    # computed before the merged file exists: it cannot have been read
    merged = tmp_path / "out" / "merged.jsonl"
    assert not merged.exists()
    merge_job(finished_job, merged)
    written = write_overall_stats(overall, finished_job, merged)
    assert sorted(p.name for p in written) == [
        "merged_overall_stats.csv", "merged_overall_stats.json", "overall.csv", "overall.json",
    ]  # fmt: skip
    body = json.loads((tmp_path / "out" / "merged_overall_stats.json").read_text())
    assert body == json.loads((finished_job / "stats" / "overall.json").read_text())
    _assert_matches_pandas(body, merged)
    # merging again gives the same bytes (deterministic sketch merges)
    assert compute_overall(finished_job).csv == overall.csv


def test_a_tampered_or_missing_summary_is_recomputed_from_that_shards_output(finished_job, tmp_path):
    reference = compute_overall(finished_job).body
    first, second, third = _done(finished_job)[:3]
    tampered = finished_job / first.stats
    tampered.write_bytes(tampered.read_bytes().replace(b'"rows":', b'"rows": '))  # same meaning, other sha256
    os.unlink(finished_job / second.stats)
    foreign = finished_job / third.stats  # a valid summary of other rows
    foreign.write_bytes((finished_job / first.stats).read_bytes())
    done_marker = finished_job / "done" / f"{third.shard_id}.json"
    record = json.loads(done_marker.read_text())
    record["stats_sha256"] = __import__("hashlib").sha256(foreign.read_bytes()).hexdigest()
    done_marker.write_text(json.dumps(record))
    again = compute_overall(finished_job).body
    assert again["summaries_recomputed"] == [first.shard_id, second.shard_id, third.shard_id]
    assert {**again, "summaries_recomputed": []} == reference


def test_an_unreadable_output_without_summary_is_one_clear_error(finished_job):
    from data_juicer_elastic.errors import IntegrityError

    first = _done(finished_job)[0]
    os.unlink(finished_job / first.stats)
    (finished_job / first.row_stats.path).write_text("{not json\n")
    with pytest.raises(IntegrityError, match="recompute its stats") as caught:
        compute_overall(finished_job)
    assert caught.value.where == f"shard {first.shard_id}"


def test_dj_elastic_merge_writes_the_overall_stats_beside_the_output(finished_job, tmp_path):
    """The user-facing finalize of `dj-elastic merge` (no Ray needed for a finished job)."""
    import subprocess
    import sys

    output = tmp_path / "cli" / "merged.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "data_juicer_elastic.cli",
            "merge",
            "--job-dir",
            str(finished_job),
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    body = json.loads((tmp_path / "cli" / "merged_overall_stats.json").read_text())
    assert body["rows"] == 300 and body["summaries_recomputed"] == []
    _assert_matches_pandas(body, output)
    csv = (tmp_path / "cli" / "merged_overall_stats.csv").read_text()
    assert csv == (finished_job / "stats" / "overall.csv").read_text()
    assert csv.splitlines()[0] == ",text_len,ratio,lang"
