"""Progress of long local steps: prepare and merge report through jobdir.steps; console shows a tqdm
bar on a terminal and periodic log lines elsewhere; a worker's current shard is followed too."""

from __future__ import annotations

from loguru import logger

from data_juicer_elastic.console import StepDisplay, shard_display
from data_juicer_elastic.jobdir import leases, progress, steps
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.merge import merge_job
from data_juicer_elastic.jobdir.prepare import prepare_job
from data_juicer_elastic.jobdir.worker_loop import run_worker

from .conftest import FakeClock, copy_runner, identity, make_rows, request, write_rows


def _log_lines():
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO")
    return lines, sink


def test_prepare_and_merge_report_until_done_equals_total(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(50))
    reports: list[tuple[str, int, int | None]] = []
    with steps.reporting(lambda *r: reports.append(r)):
        prepare_job(request(tmp_path / "job", data, 4))
        run_worker(tmp_path / "job", identity(), copy_runner(), ttl_secs=60, heartbeat_secs=10,
                   max_retries=0, poll_interval_secs=0.1)  # fmt: skip
        merge_job(tmp_path / "job", tmp_path / "out.jsonl")
    size = data.stat().st_size
    by_step: dict[str, list[tuple[int, int | None]]] = {}
    for step, done, total in reports:
        by_step.setdefault(step, []).append((done, total))
    assert list(by_step) == ["prepare: validating input", "prepare: writing shards", "merge"]
    assert by_step["prepare: validating input"][-1] == (size, size)
    assert by_step["prepare: writing shards"][-1] == (size, size)
    merged = (tmp_path / "out.jsonl").stat().st_size
    assert by_step["merge"][-1] == (merged, merged) and len(by_step["merge"]) == 4, "one report per shard"
    assert all(d <= t for d, t in sum(by_step.values(), []))
    steps.report("ignored", 1, 1)  # no callback installed: nothing happens


def test_without_a_terminal_a_log_line_every_interval_and_one_at_the_end():
    clock = FakeClock(0.0)
    lines, sink = _log_lines()
    try:
        with StepDisplay(terminal=False, log_every=30.0, clock=clock) as display:
            for k in range(1, 11):
                clock.advance(10.0)
                display("merge", k * 1024 * 1024, 10 * 1024 * 1024)
            display("next step", 1, 2)  # a new step closes the previous one
    finally:
        logger.remove(sink)
    merge = [line for line in lines if line.startswith("merge:")]
    assert len(merge) == 4, merge  # 30, 60, 90 s after the first report, and the final line
    assert merge[0] == "merge: progress 4.0 MiB/10.0 MiB (40%) in 30s, 136.5 KiB/s"
    assert merge[-1] == "merge: finished 10.0 MiB/10.0 MiB (100%) in 90s, 113.8 KiB/s"
    assert lines[-1].startswith("next step: finished 1 B/2 B (50%)")


def test_on_a_terminal_a_tqdm_bar(capsys):
    with StepDisplay(terminal=True) as display:
        for k in range(1, 5):
            display("prepare: writing shards", k * 256, 1024)
    err = capsys.readouterr().err
    assert "prepare: writing shards" in err and "100%" in err and "1.02k/1.02k" in err


def test_shard_display_follows_the_attempt_to_its_end(tmp_path):
    layout = JobLayout(tmp_path)
    claim = leases.publish_claim(layout, leases.read_lease(layout, "part-00000-of-00001"), identity(), "a1", "none")
    tracker = progress.ProgressTracker(layout, claim, 40)  # never writes: start_writing() not called
    clock = FakeClock(0.0)
    lines, sink = _log_lines()
    try:
        shard_display(terminal=False, log_every=5.0, clock=clock)(tracker)
        tracker.set_stage(progress.Stage.PROCESSING, "MapBatches(x)")
        clock.advance(6.0)
        tracker.update(rows_read=20)
        tracker.update(rows_read=40, rows_written=30)
        tracker.finish()
        tracker.update(rows_read=1)  # after the end: the display is detached
    finally:
        logger.remove(sink)
    shard = [line for line in lines if line.startswith("shard part-00000-of-00001")]
    assert shard[0].startswith("shard part-00000-of-00001: progress 20 rows/40 rows (50%)") and "processing" in shard[0]
    assert shard[-1].startswith("shard part-00000-of-00001: finished 40 rows/40 rows (100%)")
    assert shard[-1].endswith("30 rows written") and len(shard) == 2
