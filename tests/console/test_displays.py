"""Progress displays: the live line on a terminal, periodic lines elsewhere, the job's numbers, the summary."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loguru import logger

from data_juicer_elastic.console import quiet, summary
from data_juicer_elastic.console.displays import (
    LISTING_SECS,
    MIN_GAPS,
    MIN_SPAN_SECS,
    RATE_WINDOW_SECS,
    JobDisplay,
    Meter,
    StepDisplay,
    meter_line,
)
from data_juicer_elastic.jobdir import heartbeats, task_queue
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.sharedfs import fsio
from tests.jobdir.conftest import FakeClock, identity


@pytest.fixture
def lines():
    """Messages logged at INFO and above, with whether they were marked for the console."""
    seen: list[tuple[str, bool | None]] = []
    sink = logger.add(lambda m: seen.append((m.record["message"], m.record["extra"].get(quiet.CONSOLE))), level="INFO")
    yield seen
    logger.remove(sink)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def redraws(text: str) -> list[str]:
    return [part for part in text.split(quiet.CLEAR_LINE) if part]


def test_without_a_terminal_a_line_every_interval_and_one_at_the_end(lines):
    clock = FakeClock(0.0)
    with StepDisplay(terminal=False, log_every=30.0, clock=clock) as display:
        for k in range(1, 11):
            clock.advance(10.0)
            display("merge", k * 1024 * 1024, 10 * 1024 * 1024)
        display("next step", 1, 2)  # a new step closes the previous one
    merge = [(text, shown) for text, shown in lines if text.startswith("merge:")]
    assert len(merge) == 4, merge  # 30, 60, 90 s after the first report, and the final line
    assert merge[0] == ("merge: progress 4.0 MiB/10.0 MiB (40%) in 30s, 136.5 KiB/s", True)
    assert merge[-1] == ("merge: finished 10.0 MiB/10.0 MiB (100%) in 90s, 113.8 KiB/s", True)
    # a step too short for a periodic line ends in the log files only: no noise for quick steps
    assert lines[-1][0].startswith("next step: finished 1 B/2 B (50%)") and lines[-1][1] is None


def test_on_a_terminal_one_line_redrawn_in_place_and_cleared(lines):
    out = FakeTerminal()
    with StepDisplay(terminal=True, stream=out) as display:
        for k in range(1, 5):
            display("prepare: writing shards", k * 256, 1024)
    text = out.getvalue()
    assert "\n" not in text, "a live line never scrolls"
    drawn = redraws(text)
    assert len(drawn) == 4 and drawn[-1].startswith("prepare: writing shards: 100%") and "1.00k/1.00k" in drawn[-1]
    assert text.endswith(quiet.CLEAR_LINE), "cleared when the step ends"
    assert all(shown is False for text, shown in lines if text.startswith("prepare:")), "the log files get the end"


def test_log_lines_scroll_above_the_live_line():
    out = FakeTerminal()
    with quiet.live_line(out) as line:
        line.update("42% | shards 3/8")
        quiet.write("a warning\n")
        quiet.write("partial ")  # an unfinished line: the status waits for its end
        quiet.write("line\n")
        assert line.shown
    text = out.getvalue()
    assert text == (
        "\r\x1b[K42% | shards 3/8"  # drawn
        "\r\x1b[Ka warning\n\r\x1b[K42% | shards 3/8"  # cleared, the line, drawn again below it
        "\r\x1b[Kpartial line\n\r\x1b[K42% | shards 3/8"
        "\r\x1b[K"  # cleared at the end
    )


def test_streams_we_do_not_own_are_guarded_while_the_line_is_shown(monkeypatch):
    out = FakeTerminal()
    monkeypatch.setattr(quiet.sys, "stderr", out)
    with quiet.live_line(out) as line:
        line.update("status")
        print("from Ray", file=quiet.sys.stderr)  # e.g. Ray's log handler writes to sys.stderr
    assert quiet.sys.stderr is out, "restored"
    assert out.getvalue().count("status") == 2 and "\r\x1b[Kfrom Ray\n\r\x1b[Kstatus" in out.getvalue()


def test_a_pty_without_a_size_gets_a_usable_width():
    assert quiet.line_width(io.StringIO()) == quiet.FALLBACK_COLUMNS  # no fileno: like a 0x0 pty


def test_a_stall_lowers_the_rate_in_proportion_to_its_length():
    clock = FakeClock(0.0)
    meter = Meter(clock, window=60.0)
    meter.add(0)
    assert meter.rate() is None
    clock.advance(10.0)
    meter.add(50)
    assert meter.rate() is None, "two moves: no rate yet"
    clock.advance(10.0)
    meter.add(100)
    assert meter.rate() == pytest.approx(5.0)
    for _ in range(10):  # a long stall: no move for 100 s
        clock.advance(10.0)
        meter.add(100)
    # the 20 s of the three moves, and the stall beyond one usual interval (10 s) after the last
    assert meter.rate() == pytest.approx(100 / (20.0 + 90.0))
    rate = 100 / 110
    assert meter.eta(200) == pytest.approx((100 - rate * 10.0) / rate), "counted on for one usual interval only"


def _steady_job(rate: float, gaps: list[float], total: float, tick: float = 0.5):
    """A job at a steady ``rate`` whose count arrives in steps after each of ``gaps`` (a shard's
    blocks, other nodes' shards): the display's (time, rate, eta) at every tick after the window."""
    clock = FakeClock(0.0)
    meter = Meter(clock, from_first_move=True)
    seen, next_move, now, counted = [], 0.0, 0.0, 0
    moves = iter(gaps)
    while now < sum(gaps):
        if now >= next_move:
            counted = min(int(rate * now), total)  # everything done up to now, counted at once
            next_move += next(moves, float("inf"))
        meter.add(counted)  # as the display does: every tick, moved or not
        if now >= gaps[0] + RATE_WINDOW_SECS and next_move > sum(
            gaps[: MIN_GAPS + 1]
        ):  # warmed up: a full window, a few moves
            seen.append((now, meter.rate(), meter.eta(total)))
        now += tick
        clock.advance(tick)
    return seen


@settings(deadline=None, max_examples=300)  # up to minutes of a simulated job per example
@given(
    rate=st.floats(min_value=50.0, max_value=20_000.0),
    period=st.floats(min_value=1.0, max_value=20.0),
    jitter=st.lists(st.floats(min_value=-0.25, max_value=0.25), min_size=20, max_size=60),
)
def test_a_steady_throughput_counted_in_bursts_shows_a_steady_rate_and_finish_time(rate, period, jitter):
    """The rows move in steps (a shard's blocks, other nodes' whole shards) every ``period``
    seconds, give or take a quarter; the throughput under them is steady.  Once a window and a
    few moves were seen, the rate stays in a narrow band around it, between steps and across
    them, and now + ETA, the finish time shown, holds still."""
    gaps = [period * (1 + j) for j in jitter] + [period] * int(2 * RATE_WINDOW_SECS / period)
    total = rate * sum(gaps) * 2
    seen = _steady_job(rate, gaps, total)
    assert seen
    rates = [r for _, r, _ in seen]
    assert all(r is not None and 0.8 * rate <= r <= 1.1 * rate for r in rates), (min(rates), max(rates), rate)
    finish = [now + eta for now, _, eta in seen]
    assert max(finish) - min(finish) <= 0.2 * total / rate, (min(finish), max(finish), total / rate)


def _job(tmp_path, shards: dict[str, int]) -> JobLayout:
    layout = JobLayout(tmp_path)
    for name in ("done", "failed"):
        (tmp_path / name).mkdir()
    return layout


def test_job_display_counts_done_shards_and_this_process_running_rows(tmp_path, lines):
    shards = {"part-00000-of-00003": 10, "part-00001-of-00003": 20, "part-00002-of-00003": 30}
    layout = _job(tmp_path, shards)
    (tmp_path / "done" / "part-00000-of-00003.json").write_text("{}")
    clock = FakeClock(0.0)
    display = JobDisplay(tmp_path, shards, terminal=False, log_every=30.0, clock=clock)
    display.refresh_listing()
    display.draw()  # the start, which the periodic line compares with: no line yet
    claim = task_queue.publish_claim(
        layout, task_queue.read_lease(layout, "part-00001-of-00003"), identity(), "a1", "none"
    )
    tracker = heartbeats.ProgressTracker(layout, claim, 20)  # never writes: start_writing() not called
    display.attach(tracker)
    tracker.set_stage(heartbeats.Stage.PROCESSING)
    tracker.update(rows_read=5)
    clock.advance(10.0)
    numbers = display.numbers()
    assert (numbers["rows"], numbers["shards_done"], numbers["running"]) == (15, 1, 1)
    assert numbers["stage"] == "part-00001 processing"
    clock.advance(25.0)
    display.draw()
    (line,) = [text for text, shown in lines if text.startswith("progress:") and shown]
    assert line.startswith("progress: 15/60 rows (25%)") and "shards 1/3 done, 1 running here" in line

    tracker.update(rows_read=20)
    tracker.finish()  # the attempt ended; its shard is not (yet) in done/: a failed attempt
    (tmp_path / "failed" / "part-00002-of-00003.json").write_text("{}")
    clock.advance(1.0)  # counted a little longer: a published result shows in done/ at the next listing
    numbers = display.numbers()
    assert (numbers["rows"], numbers["running"], numbers["failed"]) == (30, 0, 1)
    clock.advance(10.0)
    assert display.numbers()["rows"] == 30, "the line never goes backwards"
    assert not display.trackers, "no result appeared (a failed attempt): its rows left the count"


def test_job_display_live_line_on_a_terminal(tmp_path):
    shards = {"part-00000-of-00002": 50, "part-00001-of-00002": 50}
    _job(tmp_path, shards)
    out = FakeTerminal()
    with JobDisplay(tmp_path, shards, terminal=True, stream=out, tick=0.01) as display:
        (tmp_path / "done" / "part-00000-of-00002.json").write_text("{}")
        display.refresh_listing()
        display.draw()
        (tmp_path / "done" / "part-00001-of-00002.json").write_text("{}")  # seen by the closing draw
    drawn = redraws(out.getvalue())
    assert any("50/100" in state and "shards 1/2 done" in state and "rows" in state for state in drawn), drawn
    assert "100/100" in drawn[-1] and "shards 2/2 done" in drawn[-1], "the end state is drawn before the line clears"
    assert "\n" not in out.getvalue()


def test_summary_names_rows_shards_retries_and_where_things_are(tmp_path, monkeypatch):
    from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
    from data_juicer_elastic.shards.merge import merge_job
    from data_juicer_elastic.shards.prepare import prepare_job
    from tests.jobdir.conftest import copy_runner, make_rows, request, write_rows

    data = write_rows(tmp_path / "in.jsonl", make_rows(30))
    prepare_job(request(tmp_path / "job", data, 3))
    run_worker(
        tmp_path / "job",
        identity(),
        copy_runner(lambda r: r if r["id"] % 3 else None),
        WorkerSettings(ttl_secs=60, heartbeat_secs=10, max_retries=0, poll_interval_secs=0.1),
    )
    result = merge_job(tmp_path / "job", tmp_path / "out" / "merged.jsonl")
    monkeypatch.chdir(tmp_path)
    text = summary.summary_lines(tmp_path / "job", result, 75.0, str(tmp_path / "job" / "logs" / "node-a"))
    assert text[0] == "done in 1m15s: 30 rows in, 20 rows out, 3 shards, 0 retries"
    assert text[1] == "  output  out/merged.jsonl"
    assert "dj-elastic report --job-dir job --output report.html" in text[2]
    assert text[-1] == "  logs    job/logs/node-a/"
    assert json.loads((tmp_path / "out" / "merged.jsonl").read_text().splitlines()[0])["id"] == 1


def test_process_start_is_before_now():
    import time

    assert summary.process_started() <= time.monotonic()


@given(
    idle=st.floats(min_value=0.0, max_value=600.0),
    first=st.integers(min_value=1, max_value=10_000),
    gap=st.floats(min_value=MIN_SPAN_SECS / 2 + 0.01, max_value=RATE_WINDOW_SECS / 2),  # two gaps: past the minimum
    more=st.integers(min_value=1, max_value=10_000),
)
def test_a_rate_from_the_first_move_on_never_counts_the_wait_before_it(idle, first, gap, more):
    """Ray starting, the first block read: however long nothing moved, the rate is the rows
    after the first move over the time after it, and unknown until rows moved three times over
    at least MIN_SPAN_SECS (a rate from the first two blocks of a run swings by a factor of several)."""
    clock = FakeClock(0.0)
    meter = Meter(clock, from_first_move=True)
    meter.add(0)
    clock.advance(idle)
    meter.add(0)
    assert meter.rate() is None
    meter.add(first)  # the first block: how long it took is unknown
    clock.advance(gap / 2)
    meter.add(first)
    assert meter.rate() is None, "one move: no rate yet"
    clock.advance(gap / 2)
    meter.add(first + more)
    assert meter.rate() is None, "two moves: no rate yet"
    clock.advance(gap)
    meter.add(first + 2 * more)
    assert meter.rate() == pytest.approx(more / gap)


def test_without_a_rate_the_line_shows_no_rate_and_no_time_left():
    """tqdm would compute both from the average since the start (start-up counted as work)."""
    line = meter_line("", 50, 400, 12.0, None, "rows", "shards 0/8 done | part-00000 processing", 120)
    assert "50/400 [00:12<?, ? rows/s, shards 0/8 done | part-00000 processing]" in line, line
    known = meter_line("", 50, 400, 12.0, 25.0, "rows", "shards 0/8 done", 120)
    assert "50/400 [00:12<00:14, 25.00 rows/s, shards 0/8 done]" in known, known
    counted_on = meter_line("", 50, 400, 12.0, 25.0, "rows", "shards 0/8 done", 120, eta=9.0)
    assert "50/400 [00:12<00:09, 25.00 rows/s, shards 0/8 done]" in counted_on, "the meter's ETA, not tqdm's"
    done = meter_line("", 400, 400, 20.0, None, "rows", "", 120)
    assert "400/400" in done and "<00:00" in done


def test_the_live_line_names_what_it_waits_for_until_rows_are_counted(tmp_path):
    shards = {"part-00000-of-00002": 50, "part-00001-of-00002": 50}
    layout = _job(tmp_path, shards)
    clock = FakeClock(0.0)
    ray_starting = [True]
    display = JobDisplay(tmp_path, shards, terminal=False, clock=clock,
                         waiting=lambda: "starting Ray" if ray_starting[0] else "")  # fmt: skip
    display.refresh_listing()
    assert display.numbers()["stage"] == "starting Ray"
    ray_starting[0] = False
    assert display.numbers()["stage"] == "waiting for the first shard"
    claim = task_queue.publish_claim(
        layout, task_queue.read_lease(layout, "part-00000-of-00002"), identity(), "a1", "none"
    )
    tracker = heartbeats.ProgressTracker(layout, claim, 50)
    display.attach(tracker)
    assert display.numbers()["stage"] == "first shard: part-00000 starting"
    tracker.set_stage(heartbeats.Stage.PROCESSING)
    tracker.update(rows_read=10)
    clock.advance(30.0)
    numbers = display.numbers()
    assert numbers["stage"] == "part-00000 processing" and numbers["rate"] is None, "one move: no rate, no ETA"
    assert "ETA" not in display.plain_line(numbers)
    clock.advance(5.0)
    tracker.update(rows_read=20)
    assert display.numbers()["rate"] is None, "two moves: no rate yet"
    clock.advance(5.0)
    tracker.update(rows_read=30)
    assert display.numbers()["rate"] == pytest.approx(2.0), "20 rows in the 10 s after the first move"


@settings(max_examples=40, deadline=None)  # each example writes claims: slow on a loaded machine
@given(
    steps=st.lists(
        st.tuples(st.integers(min_value=0, max_value=2), st.integers(min_value=0, max_value=40), st.booleans()),
        min_size=1,
        max_size=30,
    )
)
def test_the_row_count_never_goes_back_and_never_passes_the_total(tmp_path_factory, steps):
    """Attempts move through their shards, end without a result (their rows leave the count) and
    are tried again; whatever the order, the rows shown only grow, up to the job's total."""
    tmp_path = tmp_path_factory.mktemp("monotone")
    shards = {f"part-0000{k}-of-00003": 40 for k in range(3)}
    layout = _job(tmp_path, shards)
    clock = FakeClock(0.0)
    display = JobDisplay(tmp_path, shards, terminal=False, clock=clock)
    trackers: dict[int, heartbeats.ProgressTracker] = {}
    shown = [display.numbers()["rows"]]
    for attempt, (k, rows, ends) in enumerate(steps):
        shard = f"part-0000{k}-of-00003"
        if k not in trackers:
            lease = task_queue.read_lease(layout, shard)
            claim = task_queue.publish_claim(layout, lease, identity(), f"a{attempt}", "none")
            trackers[k] = heartbeats.ProgressTracker(layout, claim, 40)
            display.attach(trackers[k])
            trackers[k].set_stage(heartbeats.Stage.PROCESSING)
        tracker = trackers[k]
        tracker.update(rows_read=max(rows, tracker.current.rows_read))  # an attempt's count only grows
        if ends:  # ended without a result: a failed attempt, tried again later
            tracker.finish()
            del trackers[k]
        clock.advance(3.0)  # past the grace a finished attempt's rows count for
        shown.append(display.numbers()["rows"])
    assert shown == sorted(shown) and shown[-1] <= 120, shown


def test_without_a_terminal_a_line_every_ten_seconds_while_rows_move_and_every_minute_while_not(tmp_path, lines):
    """A pipe or a log file read live: the job's line often enough to see it move, never a line per tick."""
    shards = {"part-00000-of-00001": 1000}
    layout = _job(tmp_path, shards)
    clock = FakeClock(0.0)
    display = JobDisplay(tmp_path, shards, terminal=False, clock=clock)
    claim = task_queue.publish_claim(
        layout, task_queue.read_lease(layout, "part-00000-of-00001"), identity(), "a1", "none"
    )
    tracker = heartbeats.ProgressTracker(layout, claim, 1000)
    display.attach(tracker)
    tracker.set_stage(heartbeats.Stage.PROCESSING)
    said, read = [], 0
    for second in range(1, 241):  # rows move for two minutes, then stall for two
        clock.advance(1.0)
        if second <= 120:
            tracker.update(rows_read=5 * second)
        display.draw()
        said += [second for text, shown in lines[read:] if text.startswith("progress:") and shown]
        read = len(lines)
    moving, stalled = [s for s in said if s <= 120], [s for s in said if s > 120]
    assert moving == list(range(10, 121, 10)), said
    assert stalled == [180, 240], said


def test_the_running_shards_of_this_nodes_other_slots_count_from_their_progress_records(tmp_path, monkeypatch):
    """Slots are processes of their own: their running shards count by the progress records they
    write, found through the job summary's live claims; another node's running shard counts once done."""
    from types import SimpleNamespace

    from data_juicer_elastic.console import displays
    from data_juicer_elastic.jobdir.job_summary import Holder

    shards = {f"part-0000{k}-of-00003": 100 for k in range(3)}
    layout = _job(tmp_path, shards)
    live = {}
    for k, node in enumerate(("node-a", "node-a", "node-b")):
        shard = f"part-0000{k}-of-00003"
        attempt = identity(node).new_attempt_id()
        claim = task_queue.publish_claim(layout, task_queue.read_lease(layout, shard), identity(node), attempt, "none")
        tracker = heartbeats.ProgressTracker(layout, claim, 100)
        layout.attempt_dir(shard, attempt).mkdir(parents=True)
        tracker.start_writing()
        tracker.set_stage(heartbeats.Stage.PROCESSING)
        tracker.update(rows_read=10 * (k + 1))
        assert tracker.flush()
        live[shard] = Holder(node, identity(node).pid, False, None)
    view = SimpleNamespace(done_ids=set, failed=[], interval_secs=1.0, live=live)
    monkeypatch.setattr(displays, "view_of", lambda _layout: view)
    display = JobDisplay(tmp_path, shards, terminal=False, clock=FakeClock(0.0), node_id="node-a")
    display.refresh_listing()
    numbers = display.numbers()
    assert (numbers["rows"], numbers["running"]) == (10 + 20, 2), "this node's two slots; node-b's shard once done"


def test_every_display_of_a_run_counts_from_its_submission(tmp_path):
    """One clock: the run's record says when it was submitted; a display started any time later
    (after the plan, after the scans) shows the time since then, as the closing summary does."""
    import time

    from data_juicer_elastic.coordination.run import RunRecord
    from data_juicer_elastic.sharedfs import fsio

    layout = JobLayout(tmp_path)
    assert abs(summary.run_clock_start(tmp_path) - summary.process_started()) < 1.0, "no run: this process's start"
    submitted = time.time() - 100.0
    key = "ab" * 8
    fsio.makedirs(layout.run_dir(key))
    fsio.write_new(layout.run_record(key), RunRecord("run-abab", "derived", submitted, "i-1").encode())
    start = summary.run_clock_start(tmp_path)
    assert time.monotonic() - start == pytest.approx(100.0, abs=1.0)
    out, clock = FakeTerminal(), FakeClock(start + 100.0)
    with StepDisplay(terminal=True, stream=out, clock=clock, started=start) as display:
        display("merge", 1, 2)  # a step begun 100 s into the run
    assert "[01:40<" in redraws(out.getvalue())[0], out.getvalue()


def test_the_line_names_the_deduplication_phase_until_the_shards_run(tmp_path, lines, monkeypatch):
    """A job stopped in its first deduplicator's bucket phase (the fault driver, exact dedup computed in
    Python): the line names that phase as `dj-elastic status` does; once every stage is decided, the
    shards.  Each refresh lists at most one phase folder."""
    import signal

    from tests.faults.conftest import run_driver
    from tests.faults.fakes import DEDUP_PROCESS, prepare

    job = prepare(tmp_path, 40, 4, process=DEDUP_PROCESS)
    proc = run_driver("worker", job, "--dedup", crash="link:.edges@2")  # one bucket group published
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    shards = {f"part-{i:05d}-of-00004": 10 for i in range(4)}
    clock = FakeClock(0.0)
    display = JobDisplay(job, shards, terminal=False, log_every=10.0, clock=clock)
    listed, real = [], fsio.list_names
    monkeypatch.setattr(fsio, "list_names", lambda directory: listed.append(str(directory)) or real(directory))
    display.refresh_listing()
    monkeypatch.undo()
    assert [name for name in listed if "/dedup/" in name] == [str(job / "dedup" / "1" / "edges")]
    numbers = display.numbers()
    assert numbers["stage"] == numbers["dedup"] == "dedup 1/2 document_deduplicator: buckets 1/4"
    display.draw()
    clock.advance(61.0)  # nothing moved: the idle line, a minute on
    display.draw()
    said = [text for text, shown in lines if text.startswith("progress:") and shown]
    assert said and "; dedup 1/2 document_deduplicator: buckets 1/4; elapsed" in said[-1], said

    assert run_driver("worker", job, "--dedup").returncode == 0
    clock.advance(LISTING_SECS)
    numbers = display.numbers()
    assert numbers["dedup"] == "" and "dedup" not in numbers["stage"] and numbers["shards_done"] == 4
    assert "dedup" not in display.plain_line(numbers)


def test_a_job_without_a_deduplicator_shows_no_phase(tmp_path):
    shards = {"part-00000-of-00002": 50, "part-00001-of-00002": 50}
    _job(tmp_path, shards)
    display = JobDisplay(tmp_path, shards, terminal=False, clock=FakeClock(0.0))
    display.refresh_listing()
    assert display.numbers()["dedup"] == "" and display.numbers()["stage"] == "waiting for the first shard"
