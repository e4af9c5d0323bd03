"""Fast tests below the report command: what is read from a job directory (real record writers), the
pure series, and the CLI's errors."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_juicer_elastic import cli
from data_juicer_elastic.jobdir import attempts, heartbeats, task_queue
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.shard_state import ShardState
from data_juicer_elastic.report import series
from data_juicer_elastic.report.render import write_report
from data_juicer_elastic.status.job_history import AttemptOutcome, read_history
from tests.report.synthetic_job import _identity, build_job


@pytest.fixture(scope="module")
def small_job(tmp_path_factory) -> Path:
    """8 shards on 3 nodes: shard 7 failed terminally, shards 1-2 retried, shard 6 running."""
    return build_job(tmp_path_factory.mktemp("small"), num_shards=8, nodes=3, failed=1, retried=2, running=1)


def test_facts_of_a_job_with_retries_failures_and_a_running_shard(small_job):
    facts = read_history(small_job)
    assert facts.counts == {
        ShardState.PENDING: 0,
        ShardState.RUNNING: 1,
        ShardState.STALE: 0,
        ShardState.DONE: 6,
        ShardState.FAILED: 1,
    }
    by_shard = {}
    for attempt in facts.attempts:
        by_shard.setdefault(attempt.shard_index, []).append(attempt)
    assert [a.outcome for a in by_shard[1]] == [AttemptOutcome.FAILED, AttemptOutcome.DONE]
    assert [a.ordinal for a in by_shard[1]] == [1, 2] and by_shard[1][1].retried
    assert [a.outcome for a in by_shard[7]] == [AttemptOutcome.FAILED, AttemptOutcome.FAILED]
    assert by_shard[6][0].outcome is AttemptOutcome.RUNNING and by_shard[6][0].ended_at is None
    assert facts.shards[7].last_error.startswith("RuntimeError: synthetic failure of part-00007-of-00008")
    assert len({a.node_id for a in facts.attempts}) == 3
    assert facts.warnings == []


def test_the_report_and_status_show_the_same_job(small_job, tmp_path):
    """One read model: the report's cards give the shard counts, rows done and retried shards
    `dj-elastic status --json` gives, on a job with retries, a terminal failure and a
    running shard; and both agree with the job's records (done markers, failure records)."""
    import json
    import re

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    status = subprocess.run(
        ["dj-elastic", "status", "--job-dir", str(small_job), "--json"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    document = json.loads(status.stdout)
    report = tmp_path / "r.html"
    made = subprocess.run(
        ["dj-elastic", "report", "--job-dir", str(small_job), "--output", str(report)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    cards = dict(
        (label, value)
        for value, label in re.findall(r'<div class="card"><b[^>]*>([^<]+)</b>([^<]+)</div>', report.read_text())
    )
    counts = document["counts"]
    assert cards["shards done"] == f"{counts['done']} / {sum(counts.values())}"
    # every duration reads as `status` writes it (23.2s, 4m05s, 1h02m03s): the cards, the nodes' busy
    # time, each attempt's hover text and the time axes; never 1.1 min, 0.0 s or a clock's 1:02
    text = report.read_text()
    duration = r"(\d+\.\ds|\d+m\d\ds|\d+h\d\dm\d\ds)"
    hovers = re.findall(rf"\n{duration} to {duration} \({duration}\), started", text)
    assert len(hovers) >= 10, "one per attempt drawn"
    assert re.fullmatch(duration, cards["wall time so far"]), cards
    assert not re.findall(r"\b\d+(?:\.\d+)? (?:s|min|h)\b|(?<![\d:])\d{1,2}:\d\d(?![\d:])", text)
    assert cards["running / stale"] == f"{counts['running']} / {counts['stale']}"
    assert cards["input rows done"].split(" / ")[0] == f"{document['rows_done']:,}"
    assert cards["shards retried"] == str(document["retried"])
    assert document["rows_per_sec"] == 0 and "input rows/s now" not in cards  # no progress record: no rate
    layout = JobLayout(small_job)  # the oracle: the records themselves
    assert counts["done"] == len(list(layout.done_dir.glob("*.json"))) == 6
    assert document["retried"] == len([d for d in layout.failures_dir.iterdir() if d.name != "part-00007-of-00008"])


def test_a_running_attempt_is_judged_as_status_judges_it(tmp_path):
    """The holder of a claim made on this machine by a process that is gone is stale for `status`
    at once (its heartbeat file is fresh, so an age rule alone would call it running); the report
    shows that attempt as status shows its shard: stale, with status's heartbeat age."""
    import dataclasses

    from data_juicer_elastic.sharedfs.identity import WorkerIdentity
    from data_juicer_elastic.status.job_view import read_view

    job = build_job(tmp_path, num_shards=2, nodes=1, failed=0, retried=0, running=0, pending=(1,))
    layout = JobLayout(job)
    shard = "part-00001-of-00002"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = dataclasses.replace(WorkerIdentity.current(), pid=int(gone.stdout))
    claim = task_queue.publish_claim(
        layout, task_queue.read_lease(layout, shard), holder, holder.new_attempt_id(), "none"
    )
    attempts.open_attempt(layout, claim, holder)
    heartbeats.write_heartbeat(layout, claim, 1)
    now = time.time() + 1.0
    status = read_view(job, ttl_secs=120.0, now=now).snapshot.shards[1]
    attempt = next(a for a in read_history(job, now=now).attempts if a.attempt_id == claim.attempt_id)
    assert status.state is ShardState.STALE and status.attempt_id == claim.attempt_id
    assert attempt.outcome is AttemptOutcome.RUNNING and attempt.stale
    assert attempt.heartbeat_age_secs == status.heartbeat_age_secs < 60


def test_an_attempt_whose_worker_died_is_lost_and_ends_at_its_last_heartbeat(tmp_path):
    job = build_job(tmp_path, num_shards=2, nodes=1, failed=0, retried=0, running=0, pending=(1,))
    layout = JobLayout(job)
    shard = "part-00001-of-00002"
    dead, rescuer = _identity("node-dead", 4242), _identity("node-rescue", 4343)
    view = task_queue.read_lease(layout, shard)
    claim = task_queue.publish_claim(layout, view, dead, dead.new_attempt_id(), "none")
    attempts.open_attempt(layout, claim, dead)
    heartbeats.write_heartbeat(layout, claim, 1)
    beat = time.time()
    task_queue.record_failure(
        layout,
        claim,
        shard_id=shard,
        generation=claim.generation,
        error="lease expired: node-dead stopped renewing its claim",
        error_type="LeaseExpired",
        exit_reason="lease-expired",
        max_retries=3,
        reporter=rescuer,
    )
    facts = read_history(job, now=beat + 500)
    lost = [a for a in facts.attempts if a.attempt_id == claim.attempt_id]
    assert len(lost) == 1 and lost[0].outcome is AttemptOutcome.LOST and lost[0].detail == "lease-expired"
    assert lost[0].end_estimated and abs(lost[0].ended_at - beat) < 5
    assert facts.shards[1].state is ShardState.PENDING  # released by the failure record: claimable again


def test_a_running_attempt_with_an_old_heartbeat_is_stale_and_does_not_stretch_the_charts(small_job):
    facts = read_history(small_job)
    running = next(a for a in facts.attempts if a.outcome is AttemptOutcome.RUNNING)
    heartbeat = JobLayout(small_job).heartbeat(running.shard_id, running.generation)
    later = time.time() + 3 * 86400  # three days later, nobody renewed it (lease_ttl_secs is 120)
    stale = read_history(small_job, now=later)
    again = next(a for a in stale.attempts if a.attempt_id == running.attempt_id)
    assert again.stale and stale.shards[running.shard_index].state is ShardState.STALE
    assert abs(again.end_or(later) - heartbeat.stat().st_mtime) < 5
    win = series.window(stale.attempts, later)
    assert win.t1 < later - 86400


def test_error_text_is_escaped(tmp_path):
    job = build_job(tmp_path, num_shards=2, nodes=1, failed=1, retried=0, running=0, error="<script>x()</script>")
    html = write_report(job, tmp_path / "r.html").output.read_text()
    assert "&lt;script&gt;x()&lt;/script&gt;" in html and "<script" not in html


def test_a_prepared_job_without_attempts_has_a_report(tmp_path):
    job = build_job(tmp_path, num_shards=3, nodes=1, failed=0, retried=0, running=0, pending=range(3))
    result = write_report(job, tmp_path / "r.html")
    html = result.output.read_text()
    assert result.attempts == 0 and "No attempt has started yet." in html and "Manifest" in html


def test_cli_errors_exit_2_and_name_the_problem(small_job, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["report", "--job-dir", str(tmp_path / "empty"), "--output", str(tmp_path / "r.html")]) == 2
    assert "not prepared" in capsys.readouterr().err
    inside = small_job / "report.html"
    assert cli.main(["report", "--job-dir", str(small_job), "--output", str(inside)]) == 2
    assert "inside the job directory" in capsys.readouterr().err and not inside.exists()
    assert cli.main(["report", "--job-dir", str(small_job), "--output", str(tmp_path / "a" / "r.html")]) == 0
    assert "8 shards" in capsys.readouterr().out and (tmp_path / "a" / "r.html").exists()


# -- pure series ------------------------------------------------------------------------------------
def _attempt(node: str, start: float, end: float | None, rows: int, outcome=AttemptOutcome.DONE, ordinal=1):
    from data_juicer_elastic.status.job_history import AttemptFact

    return AttemptFact(
        shard_id="part-00000-of-00001", shard_index=0, attempt_id=f"a{start}", generation=ordinal, ordinal=ordinal,
        node_id=node, hostname=node, pid=1, started_at=start, ended_at=end, end_estimated=False, outcome=outcome,
        detail=outcome.value, input_rows=rows, input_bytes=rows * 10, output_rows=rows, error=None, batching=None,
    )  # fmt: skip


def test_throughput_spreads_accepted_rows_over_their_attempt():
    done = _attempt("a", 0.0, 10.0, 100)
    failed = _attempt("b", 0.0, 10.0, 500, AttemptOutcome.FAILED)
    running = _attempt("b", 10.0, None, 500, AttemptOutcome.RUNNING)
    data = series.throughput([done, failed, running], series.Window(0.0, 20.0), bins=4)
    assert data.total == pytest.approx([10.0, 10.0, 0.0, 0.0])
    assert data.by_node["a"] == pytest.approx([10.0, 10.0, 0.0, 0.0])
    assert series.cumulative_done([done, failed]) == [(10.0, 100)]


def test_lanes_activity_and_runs():
    lanes, used = series.pack_lanes([(0, 10), (5, 15), (10, 20), (1, 2)], max_lanes=8)
    assert used == 2 and lanes == [0, 1, 0, 1]  # (1, 2) frees lane 1 for (5, 15)
    lanes, used = series.pack_lanes([(0, 10)] * 5, max_lanes=2)
    assert used == 2 and max(lanes) == 1
    act = series.activity(
        [_attempt("a", 0, 10, 1), _attempt("a", 0, 4, 1, AttemptOutcome.FAILED)], series.Window(0, 10), 2, 0
    )
    assert act.concurrency == pytest.approx([1.8, 1.0]) and act.finished == [0, 1] and act.failed == [1, 0]
    assert series.quantize([0, 1, 2, 4], 4, 4) == [0, 1, 2, 4]
    assert series.runs_of([0, 0, 3, 3, 1]) == [(0, 1, 0), (2, 3, 3), (4, 4, 1)]


def test_report_never_writes_into_the_job(small_job, tmp_path):
    before = sorted((str(p), p.stat().st_mtime_ns) for p in small_job.rglob("*"))
    write_report(small_job, tmp_path / "r.html")
    assert sorted((str(p), p.stat().st_mtime_ns) for p in small_job.rglob("*")) == before
    assert not any(name.startswith(".r.html") for name in os.listdir(tmp_path))  # no temp file left
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "r.html").stat().st_mode & 0o777 == 0o666 & ~umask  # readable like any file the user writes


def test_the_report_command_imports_neither_ray_nor_data_juicer(small_job, tmp_path):
    code = (
        "import sys\nfrom data_juicer_elastic.cli import main\n"
        f"assert main(['report', '--job-dir', {str(small_job)!r}, '--output', {str(tmp_path / 'r.html')!r}]) == 0\n"
        "heavy = [m for m in ('ray', 'data_juicer', 'torch', 'matplotlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_axis_ticks_read_distinctly():
    from data_juicer_elastic.report import svg

    ticks, fmt = svg.bytes_ticks(14200, 14500)
    labels = [fmt(t) for t in ticks]
    assert len(set(labels)) == len(labels) > 3 and labels[0] == "13.90 KiB"
    assert svg.time_ticks(3600, 6)[:3] == [0, 600, 1200]


def test_size_traces_of_a_running_attempt_are_read_and_a_malformed_one_is_a_warning(tmp_path):
    from data_juicer_elastic.batching.runtime import BatchTrace
    from data_juicer_elastic.sharedfs import fsio

    job = build_job(tmp_path, num_shards=2, nodes=1, failed=0, retried=0, running=1)
    running = next(a for a in read_history(job).attempts if a.outcome is AttemptOutcome.RUNNING)
    directory = JobLayout(job).attempt_batching_dir(running.shard_id, running.attempt_id)
    fsio.makedirs(directory)
    for name, events in (("good", [["oom", 64, 900.0, None], ["ok", 32, 450.0, 600.0]]), ("bad", [["ok", "x", 1, 2]])):
        trace = BatchTrace("stage-a", "cpu", "text", "host", 7, time.time(), None, {"ooms": 1}, {}, events)
        fsio.atomic_write(directory / f"{name}.json", trace.encode())
    facts = read_history(job)
    assert [t.events for t in facts.traces] == [[("oom", 64, 900.0, None), ("ok", 32, 450.0, 600.0)]]
    assert len(facts.warnings) == 1 and "bad.json: malformed size trace" in facts.warnings[0]
    html = write_report(job, tmp_path / "r.html").output.read_text()
    assert html.count('class="oom"') == 1 and "adaptive batching size trace of stage-a" in html


def test_running_attempts_count_in_throughput_through_their_live_progress(tmp_path):
    from data_juicer_elastic.jobdir.heartbeats import ProgressRecord
    from data_juicer_elastic.sharedfs import fsio

    job = build_job(tmp_path, num_shards=2, nodes=1, failed=0, retried=0, running=1, rows_per_shard=100)
    running = next(a for a in read_history(job).attempts if a.outcome is AttemptOutcome.RUNNING)
    t0 = running.started_at
    record = ProgressRecord(
        shard_id=running.shard_id, attempt_id=running.attempt_id, generation=running.generation,
        node_id=running.node_id, seq=3, started_at=t0, updated_at=t0 + 4.0, elapsed_secs=4.0, stage="processing",
        operator="MapBatches(process_batched)", rows_total=100, rows_read=60, rows_written=55, source="ray-data",
        samples=[[1.0, 10.0, 9.0], [2.0, 30.0, 28.0]],
    )  # fmt: skip
    fsio.atomic_write(JobLayout(job).attempt_progress(running.shard_id, running.attempt_id), record.encode())
    live = next(a for a in read_history(job, now=t0 + 5.0).attempts if a.outcome is AttemptOutcome.RUNNING)
    assert live.progress == ((t0 + 1.0, 10), (t0 + 2.0, 30), (t0 + 4.0, 60)) and live.stage.startswith("processing")
    assert series.row_segments(live) == [(t0, t0 + 1.0, 10), (t0 + 1.0, t0 + 2.0, 20), (t0 + 2.0, t0 + 4.0, 30)]
    rates = series.throughput([live], series.Window(t0, t0 + 4.0), bins=4).total
    assert rates == pytest.approx([10.0, 20.0, 15.0, 15.0])
    html = write_report(job, tmp_path / "r.html", now=t0 + 5.0).output.read_text()
    assert f"progress: 60 of {running.input_rows} input rows read, processing (MapBatches(process_batched))" in html
    # the rate and time left now, as `status --json` gives them (one estimator): 60 rows in 4 s, and
    # the input rows neither done nor read yet at that rate
    from data_juicer_elastic.status.job_times import format_wall
    from data_juicer_elastic.status.job_view import read_view, view_json

    document = view_json(read_view(job))
    left = document["rows_total"] - document["rows_done"] - document["rows_in_progress"]
    assert document["rows_in_progress"] == 60 and left > 0
    assert (document["rows_per_sec"], document["eta_secs"]) == (15.0, round(left / 15.0, 1))
    assert '<b class="">15.0</b>input rows/s now' in html
    assert f'<b class="">{format_wall(left / 15.0)}</b>time left (ETA)' in html


def test_the_report_names_each_deduplicators_phase_then_the_rows_it_removed(tmp_path):
    """A job of the fault driver's exact-dedup fakes (two stages), stopped in the first one's bucket
    phase, then finished: the report's cards say what `dj-elastic status` says, from the same records."""
    import json
    import signal

    from tests.faults.conftest import run_driver
    from tests.faults.fakes import DEDUP_PROCESS, dedup_oracle, dedup_texts, prepare

    job = prepare(tmp_path, 40, 4, process=DEDUP_PROCESS)
    assert run_driver("worker", job, "--dedup", crash="link:.edges@2").returncode == -signal.SIGKILL
    html = write_report(job, tmp_path / "running.html").output.read_text()
    assert "dedup 1/2 document_deduplicator (process[1])" in html and "buckets 1/4" in html
    assert "dedup 2/2 document_deduplicator (process[2])" in html and "signatures 0/4" in html
    assert run_driver("worker", job, "--dedup").returncode == 0
    html = write_report(job, tmp_path / "done.html").output.read_text()
    texts = dedup_texts(40)
    reached = [t for t in texts if t]
    first, both = dedup_oracle(texts, DEDUP_PROCESS[:2]), dedup_oracle(texts, DEDUP_PROCESS)
    assert f"{len(reached) - len(first):,} of {len(reached):,} rows removed" in html
    assert f"{len(first) - len(both):,} of {len(first):,} rows removed" in html
    status = json.loads(cli_status_json(job))["dedup"]
    assert [s["dropped"] for s in status] == [len(reached) - len(first), len(first) - len(both)]


def cli_status_json(job: Path) -> str:
    from tests.faults.conftest import dj_elastic_status

    return dj_elastic_status(job, "--json").stdout
