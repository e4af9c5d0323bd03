"""Progress of the whole job (:class:`JobDisplay`: rows done/total, rows/s, shards, ETA, what the
current shard does) and of prepare and merge steps (:class:`StepDisplay`), in one line format.

On a terminal, in quiet mode, one line redrawn in place (``quiet.live_line``), formatted by
tqdm's ``format_meter``; not a tqdm bar, because the counts come from several sources (the job
directory, this process's attempts) and the rate must be the job's (:class:`Meter`: smoothed over
a window, so it holds still while the count moves in steps).  Elsewhere (a pipe, a log file, or
``-v``), a plain line every ``log_every`` seconds while the count moves, every ``IDLE_LOG_SECS``
while it does not, not a scroll of bar redraws.  The elapsed time is one clock from the process's
start (``summary.process_started``): the scans and the shards do not each start their own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any, Final

from tqdm import tqdm

from data_juicer_elastic.console import quiet
from data_juicer_elastic.console.summary import shown_path
from data_juicer_elastic.dedup.phase_progress import StageProgress, stage_progress
from data_juicer_elastic.dedup.stages import DedupStage, dedup_stages
from data_juicer_elastic.jobdir.heartbeats import PeriodicThread, ProgressTracker, Stage, read_attempt_progress
from data_juicer_elastic.jobdir.job_summary import Holder, view_of
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import safe_name
from data_juicer_elastic.status.scan_phase import shard_names
from data_juicer_elastic.status.throughput import eta_secs

RATE_WINDOW_SECS: Final = 30.0
# No rate before the count has moved this often over this long: the first blocks of a run come
# as Ray's workers start, and a rate from two of them swings by a factor of several.
MIN_MOVES: Final = 3
MIN_SPAN_SECS: Final = 5.0
MIN_GAPS: Final = 4  # the rate spans at least this many waits between moves, older than the window if need be

Clock = Callable[[], float]


class Meter:
    """Units per second over the last ``window`` seconds of moves, and a time left, that hold still
    while the count moves in steps.  ``from_first_move``: counting starts at the first move, so the
    time before it (Ray starting, the first block read) is no part of the rate.

    Progress arrives in steps (Ray counts rows per finished block; other nodes' shards count once
    done), so the rate over "now" swings with where the clock stands between two steps.  The meter
    keeps the moments the count moved and takes the rate between the last move and the count as it
    stood ``window`` seconds before it (interpolated between the moves around it; or further back, to
    the ``MIN_GAPS``-th move before the last, where moves are rarer than that): for a steady
    throughput every move lies on one line, so the rate is that line's slope whatever the step size.
    Only once no move came for longer than the longest wait between two moves in the window does
    the time since the last move count (a stall lowers the rate, in proportion; uneven steps do
    not).  The time left runs on from the last move at that rate, so it counts down between steps
    instead of standing still and then jumping."""

    def __init__(self, clock: Clock, window: float = RATE_WINDOW_SECS, *, from_first_move: bool = False):
        self.clock, self.window, self.waits_for_move = clock, window, from_first_move
        self.moves: deque[tuple[float, float]] = deque()  # (time, value) at each change, oldest first

    def add(self, value: float) -> None:
        now = self.clock()
        if self.moves and value == self.moves[-1][1]:
            return
        if self.waits_for_move and self.moves:
            self.moves.clear()  # the first move: the rate counts from here
            self.waits_for_move = False
        self.moves.append((now, value))
        # keep one move at or before the window's start, to interpolate the count there, and at
        # least MIN_GAPS waits between moves: the longest of a few tells a stall from an uneven step
        while len(self.moves) > MIN_GAPS + 1 and self.moves[1][0] <= now - self.window:
            self.moves.popleft()

    def _slope(self) -> tuple[float, float, float, float] | None:
        """(rate, time of the last move, seconds the rate spans, the longest wait between two moves)
        over the window; None: too few moves."""
        if len(self.moves) < MIN_MOVES:
            return None
        t_last, v_last = self.moves[-1]
        start = t_last - self.window
        (t0, v0), (t1, v1) = self.moves[0], self.moves[1]
        if t0 < start < t1:  # the count at the window's start, between the two moves around it
            v0, t0 = v0 + (v1 - v0) * (start - t0) / (t1 - t0), start
        span = t_last - t0
        if span < MIN_SPAN_SECS or v_last <= v0:
            return None
        longest = max(b[0] - a[0] for a, b in pairwise(self.moves))
        return (v_last - v0) / span, t_last, span, longest

    def rate(self) -> float | None:
        found = self._slope()
        if found is None:
            return None
        rate, t_last, span, interval = found
        late = self.clock() - t_last - interval  # how far past the longest wait so far the next move is
        return rate if late <= 0 else rate * span / (span + late)

    def eta(self, total: float) -> float | None:
        """Seconds left to ``total`` at :meth:`rate`, counted on from the last move (for at most the
        longest wait between moves: past it the rate falls instead); None until there is a rate."""
        found, rate = self._slope(), self.rate()
        if found is None or not rate:
            return None
        _, t_last, _, interval = found
        done = self.moves[-1][1] + rate * min(max(self.clock() - t_last, 0.0), interval)
        return eta_secs(max(total - done, 0.0), rate)


# Without a terminal: a plain line this often while the count moves (a log read live, or tail -f,
# should not look stuck for half a minute), and this often while it does not (still alive).
LOG_EVERY_SECS: Final = 10.0
IDLE_LOG_SECS: Final = 60.0
TICK_SECS: Final = 0.5  # live line redraws
LISTING_SECS: Final = 2.0  # how often the job's done/ and failed/ directories are listed


def live(terminal_flag: bool | None) -> bool:
    """Whether to draw a live line: on a terminal and quiet (``-v`` shows Ray's own progress as before)."""
    return (quiet.is_terminal() and not quiet.verbose()) if terminal_flag is None else terminal_flag


def amount(value: float | None, unit: str) -> str:
    if value is None:
        return "?"
    if unit != "B":
        return f"{value:,.0f} {unit}"
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or suffix == "TiB":
            return f"{value:.1f} {suffix}" if suffix != "B" else f"{value:.0f} B"
        value /= 1024
    return f"{value} B"  # pragma: no cover


# Rate and time left shown unknown ("?"): tqdm's own average since the start would count the start-up as work.
_NO_RATE: Final = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<?, ?{unit}/s{postfix}]"


# The time left is the meter's (counted on between steps), not tqdm's (the rows left at the rate).
_OWN_ETA: Final = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{eta_left}, {rate_fmt}{postfix}]"


def meter_line(desc: str, done: float, total: float | None, elapsed: float, rate: float | None, unit: str,
               note: str, width: int, eta: float | None = None) -> str:  # fmt: skip
    scale = unit == "B"
    if rate is None and total and done < total:
        bar_format, extra = _NO_RATE, {}
    elif eta is not None and total:
        bar_format, extra = _OWN_ETA, {"eta_left": tqdm.format_interval(eta)}
    else:
        bar_format, extra = None, {}
    return tqdm.format_meter(
        done, total, elapsed, ncols=width, prefix=desc, unit=unit if scale else f" {unit}", unit_scale=scale,
        unit_divisor=1024 if scale else 1000, rate=rate, postfix=note or None, bar_format=bar_format, **extra,
    )  # fmt: skip


class JobDisplay:
    """The job's progress from this worker: rows done/total, rows/s, shards, ETA.

    Rows done = input rows of the shards done (every ``LISTING_SECS``: from the job summary, else a
    listing of ``done/``, informational, so not through ``fsio``'s fault points) plus the rows this
    process's running attempts have read (:meth:`attach`: the worker loop's ``on_attempt`` hook;
    they move block by block, ``execution.progress_source``).  ``started``: the clock's reading
    the elapsed time counts from (default: now), the same through the scans and the shards.
    """

    def __init__(self, job_dir: str | os.PathLike, shard_rows: dict[str, int] | None, *, terminal: bool | None = None,
                 log_every: float = LOG_EVERY_SECS, clock: Clock = time.monotonic, stream: Any = None,
                 tick: float = TICK_SECS, planned_bytes: dict[str, int] | None = None,
                 waiting: Callable[[], str] | None = None, started: float | None = None,
                 node_id: str | None = None):  # fmt: skip
        self.job_dir = Path(job_dir)
        self.layout = JobLayout(self.job_dir)
        # None while the job is being scanned (rows not known yet): the line shows the scans then,
        # by the plan's bytes per shard (``planned_bytes``), until the manifest appears
        self.scanning = ScanCount(self.job_dir, planned_bytes or {}, clock) if shard_rows is None else None
        self.shard_rows = dict(shard_rows or {})
        self.total = sum(self.shard_rows.values())
        self.dedup = DedupCount(self.layout)  # a recipe's deduplication phases, before any shard runs
        self.live, self.log_every, self.clock, self.stream = live(terminal), log_every, clock, stream
        self.trackers: dict[str, tuple[ProgressTracker, list[float | None]]] = {}
        self.node_id = node_id  # this node's other slots' running shards count too (:meth:`_slot_rows`)
        self.slot_rows: dict[str, int] = {}
        self.done: set[str] = set()
        self.failed: set[str] = set()
        self.shown_rows = 0
        self.grace = 2 * LISTING_SECS  # how long a finished attempt's rows count before its result shows
        self.last_log = self.last_listing = clock()
        self.started = self.last_log if started is None else started
        self.logged: tuple | None = None  # what the last plain line counted (a new one is due sooner once it moved)
        self.meter = Meter(clock, from_first_move=True)
        self.waiting = waiting or str  # what this worker waits for while no shard runs here ("starting Ray")
        self.lock = threading.Lock()
        self._thread = PeriodicThread(tick, self._tick, "dj-elastic-progress")
        self._line_cm = contextlib.ExitStack()
        self._line: quiet.LiveLine | None = None

    def attach(self, tracker: ProgressTracker) -> None:
        finished_at: list[float | None] = [None]

        def follow(update) -> None:
            if update.stage == Stage.FINISHED and finished_at[0] is None:
                finished_at[0] = self.clock()
                self.last_listing = float("-inf")  # list done/ at the next tick: it is probably there now

        with self.lock:
            self.trackers[tracker.claim.shard_id] = (tracker, finished_at)
        tracker.listeners.append(follow)

    def refresh_listing(self) -> None:
        self.last_listing = self.clock()
        if self.scanning is not None:
            rows = self.scanning.refresh()
            if rows is None:
                return
            self.scanning, self.shard_rows, self.total = None, rows, sum(rows.values())
            self.meter = Meter(self.clock, from_first_move=True)  # rows/s from here: the scans' time is not the shards'
            quiet.say(f"scanned {shown_path(self.job_dir)}: {self.total:,} rows in {len(rows)} shards")
        self.dedup.refresh(len(self.shard_rows))
        # From the job summary this process's worker reads (no read of its own), else listings: at
        # 1,000 nodes a listing of done/ every 2 s each would be 100,000 names a node per tick.
        view = view_of(self.layout)
        if view is not None:
            self.done.update(s for s in view.done_ids() if s in self.shard_rows)
            self.failed.update(s for s in view.failed if s in self.shard_rows)
            self.grace = 2 * max(LISTING_SECS, view.interval_secs)  # a result shows a round later
            with self.lock:  # this process's own results show at once: one look at each one's marker
                ended = [s for s, (_, at) in self.trackers.items() if at[0] is not None and s not in self.done]
            self.done.update(s for s in ended if os.path.exists(self.layout.done(s)))
            self.slot_rows = self._slot_rows(view.live) if self.node_id else {}
            return
        for name, target in (("done", self.done), ("failed", self.failed)):
            try:
                names = os.listdir(self.job_dir / name)
            except OSError:
                continue
            target.update(n[:-5] for n in names if n.endswith(".json") and n[:-5] in self.shard_rows)

    def _slot_rows(self, live: dict[str, Holder]) -> dict[str, int]:
        """Rows read by the running attempts of this node's other slots (the live claims the job
        summary lists): per claim, one listing of its shard's attempts (attempt ids sort by start
        and name their node and pid: the holder's newest is the running one) and one small read of
        its progress record.  Other nodes' running shards count once done: a read per live claim
        of the job from every node every few seconds would not scale."""
        with self.lock:
            mine = set(self.trackers)
        found = {}
        for shard, holder in live.items():
            if holder.node_id != self.node_id or holder.stale or shard in mine or shard not in self.shard_rows:
                continue
            tag = f"-{safe_name(holder.node_id)[:40]}-{holder.pid}-"
            attempts = [name for name in fsio.list_names(self.layout.attempt_root(shard)) if tag in name]
            if not attempts:
                continue
            record, _ = read_attempt_progress(self.layout, shard, attempts[-1])
            if record is not None and record.stage != Stage.FINISHED:
                found[shard] = min(record.rows_read, self.shard_rows[shard])
        return found

    def numbers(self) -> dict[str, Any]:
        now = self.clock()
        if now - self.last_listing >= LISTING_SECS:
            self.refresh_listing()
        if self.scanning is not None:
            return self.scanning.numbers(now - self.started)
        rows = sum(self.shard_rows[s] for s in self.done)
        running, stage = 0, ""
        with self.lock:
            for shard, (tracker, finished_at) in list(self.trackers.items()):
                if shard in self.done or shard in self.failed:
                    del self.trackers[shard]
                    continue
                if finished_at[0] is not None and now - finished_at[0] > self.grace:
                    del self.trackers[shard]  # ended without a result: a failed attempt, retried later
                    continue
                record = tracker.current
                rows += min(record.rows_read, record.rows_total)
                if finished_at[0] is None:
                    running += 1
                    stage = f"{shard.split('-of-')[0]} {record.stage}"
        slots = {s: n for s, n in self.slot_rows.items() if s not in self.done and s not in self.failed}
        rows, running = rows + sum(slots.values()), running + len(slots)
        # Never backwards: a failed attempt's rows leave the count, but the line should not jump back.
        self.shown_rows = max(self.shown_rows, min(rows, self.total))
        self.meter.add(self.shown_rows)
        if not self.done and not self.shown_rows:  # nothing countable yet: say what it waits for
            first = f"first shard: {stage}" if stage else self.waiting() or "waiting for the first shard"
            stage = self.dedup.text or first  # the shards wait for every deduplication phase
        elif not running:
            stage = self.waiting()
        return {
            "rows": self.shown_rows,
            "rate": self.meter.rate(),
            "eta": self.meter.eta(self.total),
            "shards_done": len(self.done),
            "running": running,
            "failed": len(self.failed),
            "stage": stage,
            "dedup": self.dedup.text,
            "elapsed": now - self.started,
        }

    def shards_note(self, n: dict[str, Any]) -> str:
        running = f", {n['running']} running here" if n["running"] else ""
        failed = f", {n['failed']} failed" if n["failed"] else ""
        return f"shards {n['shards_done']}/{len(self.shard_rows)} done{running}{failed}"

    def plain_line(self, n: dict[str, Any]) -> str:
        if "scanned" in n:
            return f"{self.scanning_note(n)}; elapsed {tqdm.format_interval(n['elapsed'])}"
        pct = f" ({100 * n['rows'] / self.total:.0f}%)" if self.total else ""
        rate, left = n["rate"], n["eta"]
        speed = f", {rate:,.1f} rows/s" if rate else ""
        eta = f", ETA {tqdm.format_interval(left)}" if left else ""
        dedup = f"{n['dedup']}; " if n.get("dedup") else ""
        return (
            f"progress: {n['rows']:,}/{self.total:,} rows{pct}{speed}{eta}; {self.shards_note(n)}; {dedup}"
            f"elapsed {tqdm.format_interval(n['elapsed'])}"
        )

    def draw(self) -> None:
        n = self.numbers()
        now = self.clock()
        if self._line is not None:
            self._line.update(self._live_text(n))
        keys = ("rows", "shards_done", "failed", "running", "scanned", "bytes", "dedup")
        counted = tuple(n.get(key) for key in keys)
        if self.logged is None:
            self.logged = counted  # the start: a first line once something moved (or a minute passed)
        if now - self.last_log >= (self.log_every if counted != self.logged else IDLE_LOG_SECS):
            self.last_log, self.logged = now, counted
            (quiet.log_only if self._line is not None else quiet.say)(self.plain_line(n))

    def scanning_note(self, n: dict[str, Any]) -> str:
        rate = f", {amount(n['rate'], 'B')}/s" if n["rate"] else ""
        return f"scanning the input: {n['scanned']}/{n['shards']} shards{rate} (no shard runs before every scan)"

    def _live_text(self, n: dict[str, Any]) -> str:
        width = quiet.line_width(self._line.stream)
        if "scanned" in n:
            note = self.scanning_note(n)
            return meter_line("", n["bytes"], n["total"], n["elapsed"], n["rate"], "B", note, width, n["eta"])
        note = self.shards_note(n) + (f" | {n['stage']}" if n["stage"] else "")
        return meter_line("", n["rows"], self.total, n["elapsed"], n["rate"], "rows", note, width, n["eta"])

    def _tick(self) -> None:
        try:
            self.draw()
        except Exception as exc:  # a display must never break the worker
            from loguru import logger

            logger.debug(f"progress display: {exc!r}")

    def __enter__(self) -> JobDisplay:
        if self.live:
            self._line = self._line_cm.enter_context(quiet.live_line(self.stream))
        self.refresh_listing()
        self.meter.add(sum(self.shard_rows[s] for s in self.done))
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._thread.stop()
        if self._line is not None:  # the end state, before the line gives way to the summary
            self.last_listing = float("-inf")
            self._line.update(self._live_text(self.numbers()))
        self._line_cm.close()
        self._line = None


class ScanCount:
    """The scan phase as the live line shows it: shards scanned (one listing of ``scans/done``)
    and their planned bytes per second; :meth:`refresh` returns the shards' rows once the
    manifest exists (the scans are over)."""

    def __init__(self, job_dir: Path, planned_bytes: dict[str, int], clock: Clock):
        self.layout = JobLayout(job_dir)
        self.planned = planned_bytes
        self.scanned: set[str] = set()
        self.meter = Meter(clock)

    def refresh(self) -> dict[str, int] | None:
        if self.layout.manifest.exists():
            try:
                return {entry.shard_id: entry.rows for entry in load_manifest(self.layout.root).shards}
            except Exception:  # noqa: BLE001 - being written: the next listing reads it
                return None
        try:
            self.scanned |= shard_names(self.layout.scans.done_dir, ".json") & self.planned.keys()
        except OSError:
            return None
        self.meter.add(sum(self.planned[s] for s in self.scanned))
        return None

    def numbers(self, elapsed: float) -> dict[str, Any]:
        done = sum(self.planned[s] for s in self.scanned)
        return {
            "scanned": len(self.scanned),
            "shards": len(self.planned),
            "bytes": done,
            "total": sum(self.planned.values()),
            "rate": self.meter.rate(),
            "eta": self.meter.eta(sum(self.planned.values())),
            "elapsed": elapsed,
        }


class DedupCount:
    """A recipe's deduplication phases as the live line shows them: the first deduplicator not yet
    decided, its phase and tasks published (``dedup.phase_progress.stage_progress``: its marker, its
    plan and at most one listing per refresh; a decided stage is not read again).  The recipe comes
    from the manifest, read once it exists; a recipe without a deduplicator costs nothing after it."""

    def __init__(self, layout: JobLayout):
        self.layout = layout
        self.stages: list[DedupStage] | None = None  # None: the manifest not read yet
        self.decided = 0  # stages decided (their marker seen)
        self.current: StageProgress | None = None

    def refresh(self, num_shards: int) -> None:
        if self.stages is None:
            if not self.layout.manifest.exists():
                return
            try:
                self.stages = dedup_stages(load_manifest(self.layout.root).recipe.get("process") or [])
            except Exception:  # noqa: BLE001 - being written, or refused: the workers say why
                return
        self.current = None
        while self.decided < len(self.stages):
            found = stage_progress(self.layout, self.stages[self.decided], len(self.stages), num_shards)
            if found.phase != "done":
                self.current = found
                return
            self.decided += 1

    @property
    def text(self) -> str:
        """``dedup 1/2 document_minhash_deduplicator: buckets 12/32``; "" once every stage is decided."""
        return self.current.text if self.current is not None else ""


class _Step:
    """One step of a StepDisplay."""

    def __init__(self, name: str, unit: str, line, log_every: float, clock: Clock, origin: float | None):
        self.name, self.unit, self.line, self.log_every, self.clock = name, unit, line, log_every, clock
        self.done, self.total = 0, None
        self.started = self.last_log = clock()
        self.origin = self.started if origin is None else origin  # the live line's elapsed counts from here
        self.meter = Meter(clock)
        self.logged = False  # a periodic line was printed: the step was long enough to report its end

    def set(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total
        self.meter.add(done)
        now = self.clock()
        if self.line is not None:
            width = quiet.line_width(self.line.stream)
            rate = self.meter.rate()
            eta = self.meter.eta(total) if total else None
            self.line.update(meter_line(self.name, done, total, now - self.origin, rate, self.unit, "", width, eta))
        if now - self.last_log >= self.log_every:
            self.last_log = now
            self._log("progress", periodic=True)

    def close(self) -> None:
        self._log("finished", periodic=False)

    def _log(self, what: str, periodic: bool) -> None:
        secs = max(self.clock() - self.started, 1e-9)
        total = f"/{amount(self.total, self.unit)}" if self.total else ""
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        rate = f", {amount(self.done / secs, self.unit)}/s" if self.done else ""
        text = f"{self.name}: {what} {amount(self.done, self.unit)}{total}{pct} in {secs:.0f}s{rate}"
        if self.line is not None:
            quiet.log_only(text)  # the live line shows it
        elif periodic or self.logged:
            self.logged = True
            quiet.say(text)
        else:
            from loguru import logger

            logger.info(text)  # a short step: log files (and -v) only


class StepDisplay:
    """A ``shards.steps`` callback: one line per step name, the previous closed when a new one starts.
    On a terminal one live line per step, else a log line every ``LOG_EVERY_SECS`` and one when a
    long step ends.  The live line's elapsed time runs from ``started`` (the process's start, as the
    job's live line), the log lines give each step's own."""

    def __init__(self, unit: str = "B", *, terminal: bool | None = None, log_every: float = LOG_EVERY_SECS,
                 clock: Clock = time.monotonic, stream: Any = None, started: float | None = None):  # fmt: skip
        self.unit, self.log_every, self.clock, self.stream, self.started = unit, log_every, clock, stream, started
        self.live = live(terminal)
        self.step: _Step | None = None
        self._line_cm = contextlib.ExitStack()
        self._line: quiet.LiveLine | None = None

    def __call__(self, step: str, done: int, total: int | None) -> None:
        if self.step is None or self.step.name != step:
            self._close_step()
            if self.live and self._line is None:
                self._line = self._line_cm.enter_context(quiet.live_line(self.stream))
            self.step = _Step(step, self.unit, self._line, self.log_every, self.clock, self.started)
        self.step.set(done, total)

    def _close_step(self) -> None:
        if self.step is not None:
            self.step.close()
            self.step = None

    def close(self) -> None:
        self._close_step()
        self._line_cm.close()
        self._line = None

    def __enter__(self) -> StepDisplay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
