"""The scan phase as users see it: `dj-elastic status` (text and --json) while the shards are scanned
and after, the live line's scan count, and the report's scan cards; through the real commands."""

from __future__ import annotations

import json
import signal

from data_juicer_elastic.console.displays import JobDisplay
from data_juicer_elastic.jobdir.manifest import load_plan
from tests.faults.commands import dj_elastic
from tests.faults.conftest import run_driver
from tests.faults.fakes import write_input

SHARDS = 4


def _planned(tmp_path):
    data = write_input(tmp_path / "input.jsonl", 40)
    job = tmp_path / "job"
    assert run_driver("prepare", job, data, "--shards", SHARDS, "--plan-only").returncode == 0
    return job


def _status(job, *args):
    proc = dj_elastic("status", "--job-dir", job, *args)
    return proc.returncode, proc.stdout


def test_status_shows_the_scans_before_any_shard_runs_then_the_scan_phase_and_the_first_shard(tmp_path):
    job = _planned(tmp_path)
    code, text = _status(job, "--json")
    data = json.loads(text)
    assert code == 1 and data["phase"] == "scanning" and data["complete"] is False
    assert (data["scan"]["scanned"], data["scan"]["shards"], data["scan"]["refused"]) == (0, SHARDS, 0)
    assert data["scan"]["bytes_total"] == load_plan(job).total_bytes

    half = run_driver("worker", job, crash="scanned@2")  # two scans published, then the scanner dies
    assert half.returncode == -signal.SIGKILL, half.stderr[-2000:]
    code, text = _status(job)
    assert code == 1 and "scan: 2/4 shards scanned" in text and "no shard runs before every shard is scanned" in text

    assert run_driver("worker", job).returncode == 0
    code, text = _status(job, "--json", "--all")  # --all: the done shards' attempts are read
    data = json.loads(text)
    assert code == 0 and data["complete"] and data["scan"]["scanned"] == SHARDS
    assert data["scan"]["bytes_scanned"] == data["scan"]["bytes_total"] and data["scan"]["bytes_per_sec"] > 0
    assert data["first_shard_secs"] is not None and data["first_shard_secs"] >= 0
    code, text = _status(job, "--all")
    assert "scan: 4/4 shards scanned" in text and "first shard running" in text

    report = tmp_path / "report.html"
    assert dj_elastic("report", "--job-dir", job, "--output", report).returncode == 0
    html = report.read_text()
    assert "scan (every shard checked)" in html and "first shard running after submission" in html


def test_the_live_line_counts_the_scans_then_the_rows(tmp_path):
    job = _planned(tmp_path)
    planned = {entry.shard_id: entry.bytes for entry in load_plan(job).shards}
    display = JobDisplay(job, None, terminal=False, planned_bytes=planned)
    display.refresh_listing()
    numbers = display.numbers()
    assert (numbers["scanned"], numbers["shards"]) == (0, SHARDS)
    assert "scanning the input: 0/4 shards" in display.plain_line(numbers)
    assert run_driver("worker", job).returncode == 0
    display.last_listing = float("-inf")
    numbers = display.numbers()
    assert "scanned" not in numbers and display.total == 40, "the manifest's rows once the scans are over"
    assert "40/40 rows" in display.plain_line(numbers)


def test_after_a_scan_refused_the_input_verify_report_and_merge_name_the_refusal(tmp_path):
    """While shards remain unscanned, "start workers" is the way on; once the scans refused the input
    (a malformed line), workers would only refuse it again: verify, report, merge and status name the line
    (file:line, what is wrong, a new job_dir) and exit 2, writing nothing."""
    data = tmp_path / "input.jsonl"
    lines = [json.dumps({"id": i, "text": f"row {i}"}) for i in range(40)]
    lines[25] = '{"id": 25, "text": '  # line 26: no value
    data.write_text("\n".join(lines) + "\n")
    job = tmp_path / "job"
    assert run_driver("prepare", job, data, "--shards", SHARDS, "--plan-only").returncode == 0
    planned = dj_elastic("verify", "--job-dir", job)
    assert planned.returncode == 2 and "not all scanned yet" in planned.stderr and "start workers" in planned.stderr

    refused = run_driver("worker", job)
    assert refused.returncode == 2 and f"{data}:26: invalid JSON" in refused.stderr, refused.stderr[-2000:]
    report, merged = tmp_path / "report.html", tmp_path / "merged.jsonl"
    for command in (["verify"], ["report", "--output", report], ["merge", "--output", merged]):
        proc = dj_elastic(command[0], "--job-dir", job, *command[1:])
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert f"{data}:26: the job's scan refused its input: invalid JSON" in last, (command, last)
        assert "with a new job_dir" in last and "start workers" not in proc.stderr, (command, last)
    assert not report.exists() and not merged.exists()
    status, as_json = dj_elastic("status", "--job-dir", job), dj_elastic("status", "--job-dir", job, "--json")
    assert status.returncode == as_json.returncode == 2, status.stderr + as_json.stderr
    said = status.stdout.splitlines()
    assert any(line.startswith(f"error: {data}:26: the job's scan refused its input: invalid JSON") for line in said)
    assert json.loads(as_json.stdout)["error"].startswith(f"{data}:26: the job's scan refused its input: invalid JSON")
