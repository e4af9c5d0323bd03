"""The job's times (``status.job_times``) where the job ends at a merge, not at a run's outcome.

Real commands in subprocesses (the fault driver's worker: the package's worker loop with the fast
fake runner instead of Ray; ``dj-elastic merge``, ``retry``, ``status``, ``report``):

* ``prepare`` + ``worker`` + ``merge``: no run record says the job finished; the merge does, so
  ``status`` shows it finalized at merge.json's time and the report's wall time is the same;
* a run finalized by its own outcome, then a shard requeued by ``retry`` and rerun by a worker and
  merged: while the shard is left the job is not finalized (no finish shown); after the rerun the
  first outcome is before the last accepted result, so the later merge is the finish.

The oracles are the job directory's own records (merge.json, the pace records' last result) and
the rows merged against the input.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from data_juicer_elastic.status.job_times import format_wall

from .commands import SHARD0, dj_elastic
from .conftest import run_driver, summary_of
from .fakes import merged_ids, write_input


def _status(job: Path) -> tuple[dict, str]:
    as_json = dj_elastic("status", "--job-dir", job, "--json")
    text = dj_elastic("status", "--job-dir", job)
    assert as_json.returncode in (0, 1) and text.returncode == as_json.returncode, as_json.stderr[-2000:]
    return json.loads(as_json.stdout), text.stdout


def _times_line(text: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.strip().startswith("submitted "))


def _report_wall(job: Path, out: Path) -> str:
    proc = dj_elastic("report", "--job-dir", job, "--output", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cards = dict(
        (label, value) for value, label in re.findall(r'<b class="[^"]*">([^<]*)</b>([^<]*)</div>', out.read_text())
    )
    assert "wall time so far" not in cards, cards
    return cards["wall time"]


def _merge(job: Path, output: Path) -> float:
    proc = dj_elastic("merge", "--job-dir", job, "--output", output)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((job / "merge.json").read_bytes())["merged_at"]


def _assert_finalized_at_merge(job: Path, merged_at: float, tmp: Path) -> dict:
    data, text = _status(job)
    times = data["times"]
    assert times["finalized_at"] == merged_at and times["ok"] is True, times
    assert times["last_shard_done_at"] <= merged_at, times
    wall = merged_at - times["submitted_at"]
    assert abs(times["wall_secs"] - wall) < 0.01, times
    assert _times_line(text).endswith(f"finalized after {format_wall(times['wall_secs'])}"), text
    assert _report_wall(job, tmp / "report.html") == format_wall(times["wall_secs"])
    return times


def test_a_job_run_by_workers_and_merged_is_finalized_at_its_merge(tmp_path):
    data = write_input(tmp_path / "input.jsonl", 40)
    job = tmp_path / "job"
    assert run_driver("prepare", str(job), str(data), "--shards", "4").returncode == 0
    worker = run_driver("worker", str(job), "--ttl", "600", "--no-wait")
    assert worker.returncode == 0 and summary_of(worker)["done"] == 4, worker.stderr[-2000:]
    data_before, _ = _status(job)
    assert data_before["times"]["finalized_at"] is None, "not merged yet: still running"

    merged_at = _merge(job, tmp_path / "merged.jsonl")
    times = _assert_finalized_at_merge(job, merged_at, tmp_path)
    assert times["run_id"] is None  # no run record: the plan's time is the submission
    assert merged_ids(tmp_path / "merged.jsonl") == list(range(40))


def test_a_retried_job_is_not_finalized_until_its_rerun_is_merged(tmp_path):
    data = write_input(tmp_path / "input.jsonl", 40)
    job, output = tmp_path / "job", tmp_path / "merged.jsonl"
    run = run_driver("run", str(job), str(data), str(output), "--run-id", "first", "--shards", "4")
    assert run.returncode == 0, run.stderr[-2000:]
    first, _ = _status(job)
    first_end = first["times"]["finalized_at"]
    assert first_end is not None and first["times"]["run_id"] == "first"

    marker = job / "done" / f"{SHARD0}.json"  # a shard's output altered: retry requeues it
    result = job / json.loads(marker.read_bytes())["output"]
    result.write_bytes(result.read_bytes().replace(b'"id"', b'"ID"', 1))
    proc = dj_elastic("retry", "--job-dir", job, "--shard-id", SHARD0)
    assert proc.returncode == 0, proc.stderr[-2000:]
    left, text = _status(job)
    assert left["times"]["finalized_at"] is None and left["times"]["ok"] is None, left["times"]
    line = _times_line(text)  # the run's own line (coordination) keeps its history: that run did finalize
    assert "finalized" not in line and "last shard done so far after" in line and line.endswith("so far"), text

    worker = run_driver("worker", str(job), "--ttl", "600", "--no-wait")
    assert worker.returncode == 0 and summary_of(worker)["done"] == 1, worker.stderr[-2000:]
    rerun, _ = _status(job)
    assert rerun["times"]["last_shard_done_at"] > first_end, "the rerun's result is after the first finish"
    assert rerun["times"]["finalized_at"] is None, "complete again, but not merged: the first finish is history"

    merged_at = _merge(job, output)
    times = _assert_finalized_at_merge(job, merged_at, tmp_path)
    assert times["run_id"] == "first" and times["submitted_at"] == first["times"]["submitted_at"]
    assert merged_ids(output) == list(range(40))
