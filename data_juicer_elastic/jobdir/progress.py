"""Live progress of one running attempt, ``attempts/<shard>/<attempt>/progress.json``: informational
only, written after lease renewals (the record and its rules: docs/status.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import ClassVar, Final

from loguru import logger

from data_juicer_elastic.errors import JobDirError, clip
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.liveness import Liveness
from data_juicer_elastic.jobdir.records import Claim, Record
from data_juicer_elastic.sharedfs import fsio

MAX_SAMPLES: Final = 64  # samples kept per attempt; older ones are thinned, never all dropped
MAX_OPERATOR_CHARS: Final = 200
FIRST_WRITE_SECS: Final = 1.0  # an attempt's first change is written this long after it (write_every)


class Stage(enum.StrEnum):
    """What a running attempt is doing; the only place stage names are spelled."""

    STARTING = "starting"  # claimed; checking the input shard, building the Data-Juicer config
    LOADING = "loading"  # Data-Juicer inspects the input (schema probe, row count)
    PROCESSING = "processing"  # the recipe's operators run over the shard (rows_read grows)
    EXPORTING = "exporting"  # Ray writes the processed rows into part files
    CANONICALIZING = "canonicalizing"  # part files -> output.jsonl in input order
    PUBLISHING = "publishing"  # the output is validated and published
    FINISHED = "finished"  # the attempt ended (see attempt.json for how)


@dataclass(frozen=True)
class ProgressRecord(Record):
    KIND: ClassVar[str] = "progress"
    COMPACT: ClassVar[bool] = True  # rewritten every heartbeat, and the samples would take a line per number
    shard_id: str
    attempt_id: str
    generation: int
    node_id: str
    seq: int  # +1 per write of this attempt
    started_at: float  # writer's wall clock when the attempt started (display only)
    updated_at: float  # writer's wall clock at this write (display only)
    elapsed_secs: float  # writer's monotonic seconds since the attempt started
    stage: str  # a Stage value
    operator: str | None  # Ray Data operator running now (processing/exporting), None otherwise
    rows_total: int  # input rows of the shard (manifest)
    rows_read: int  # input rows the processing pass has read so far
    rows_written: int  # rows out of the recipe's last operator so far; exact output rows once canonicalized
    source: str  # where the row counts come from: "ray-data" | "none"
    # [elapsed_secs, rows_read, rows_written] over the attempt, oldest first, at most MAX_SAMPLES
    samples: list[list[float]] = field(default_factory=list)


def read_attempt_progress(
    layout: JobLayout, shard_id: str, attempt_id: str
) -> tuple[ProgressRecord | None, str | None]:
    """(record, None); (None, None) when there is none yet; (None, error) when it is unreadable."""
    try:
        path = layout.attempt_progress(shard_id, attempt_id)  # refuses an attempt id that leaves the job dir
        record = ProgressRecord.read(path)
    except (OSError, JobDirError) as exc:
        return None, str(exc)
    if record is None:
        return None, None
    if (record.shard_id, record.attempt_id) != (shard_id, attempt_id):  # a copied or misplaced file
        return None, f"{path}: progress record names {record.shard_id} attempt {record.attempt_id}"
    return record, None


class ProgressTracker:
    """In-memory progress of one attempt, written out by :meth:`flush`.  Thread-safe (the runner,
    Ray Data's executor thread and the heartbeat thread all touch it); listeners (a terminal
    progress bar) are called on every change, outside the lock, and must be cheap."""

    def __init__(
        self,
        layout: JobLayout,
        claim: Claim,
        rows_total: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        write_every: float | None = None,
    ):
        """``write_every``: also write each change within that many seconds (one write per such
        window, from a timer thread; the first change within ``FIRST_WRITE_SECS``, so the rows that
        follow the stage come with it): a reader sees a short attempt's rows while it runs, not
        only after a heartbeat or two."""
        self.layout, self.claim, self.clock = layout, claim, clock
        self.write_every = write_every
        self._last_write: float | None = None
        self._timer: threading.Timer | None = None
        self._t0 = clock()
        self._lock = threading.Lock()
        self._record = ProgressRecord(
            shard_id=claim.shard_id,
            attempt_id=claim.attempt_id,
            generation=claim.generation,
            node_id=claim.node_id,
            seq=0,
            started_at=time.time(),
            updated_at=time.time(),
            elapsed_secs=0.0,
            stage=Stage.STARTING.value,
            operator=None,
            rows_total=rows_total,
            rows_read=0,
            rows_written=0,
            source="none",
        )
        self._dirty = False  # no write before the first change: the claim tells a reader the attempt started
        self._writable = False  # until the attempt directory exists and was checked (start_writing)
        self._samples: list[list[float]] = []
        self.listeners: list[Callable[[ProgressRecord], None]] = []
        # the attempt's stall rule (jobdir.liveness), if any: the runner registers its probe and restart with it
        self.liveness: Liveness | None = None

    @property
    def current(self) -> ProgressRecord:
        with self._lock:
            return replace(self._record, elapsed_secs=self.clock() - self._t0, samples=list(self._samples))

    def start_writing(self) -> None:
        """The attempt directory exists (``attempts.open_attempt`` created it and checked that it
        lies inside the job directory): flushes may write from now on.  The tracker never creates
        a directory itself, so a planted symlink cannot lead it out of the job directory."""
        with self._lock:
            self._writable = True
        if self._dirty:
            self._schedule_write()

    def set_stage(self, stage: Stage, operator: str | None = None) -> None:
        self._change(stage=Stage(stage).value, operator=operator and clip(operator, MAX_OPERATOR_CHARS))

    def update(
        self,
        *,
        rows_read: int | None = None,
        rows_written: int | None = None,
        operator: str | None = None,
        source: str | None = None,
    ) -> None:
        counts = {"rows_read": rows_read, "rows_written": rows_written}
        changes: dict[str, object] = {k: int(v) for k, v in counts.items() if v is not None}
        texts = {"operator": operator and clip(operator, MAX_OPERATOR_CHARS), "source": source}
        self._change(**changes, **{k: v for k, v in texts.items() if v is not None})

    def _change(self, **changes: object) -> None:
        with self._lock:
            changed = not all(getattr(self._record, k) == v for k, v in changes.items())
            if changed:
                self._record = replace(self._record, **changes)
                self._dirty = True
            record = self._record
        if changed:
            for listener in list(self.listeners):
                try:
                    listener(record)
                except Exception as exc:  # a display must never break the attempt
                    logger.debug(f"progress listener failed: {exc}")
        if changed:
            self._schedule_write()

    def _schedule_write(self) -> None:
        """A timer writes the change ``write_every`` after the last write (a write already due
        takes the change along)."""
        with self._lock:
            if self.write_every is None or not self._writable or self._timer is not None:
                return
            if self._last_write is None:
                delay = min(FIRST_WRITE_SECS, self.write_every)
            else:
                delay = max(0.0, self._last_write + self.write_every - self.clock())
            self._timer = threading.Timer(delay, self._timed_write)
            self._timer.daemon = True
            self._timer.start()

    def _timed_write(self) -> None:
        with self._lock:
            self._timer = None
            dirty = self._dirty
        if dirty:
            self.flush()

    def flush(self, force: bool = False) -> bool:
        """Write the record (the heartbeat thread, after a renewal); True if written, errors logged.
        Nothing is written until something changed; from then on every call writes (docs/status.md)."""
        with self._lock:
            if not self._writable or not (self._dirty or force or self._record.seq > 0):
                return False
            elapsed = self.clock() - self._t0
            sample = [round(elapsed, 3), float(self._record.rows_read), float(self._record.rows_written)]
            if not self._samples or self._samples[-1][1:] != sample[1:]:
                self._samples.append(sample)
                if len(self._samples) > MAX_SAMPLES:
                    # keep the first and every other one: the whole attempt, at half the resolution
                    self._samples = self._samples[:1] + self._samples[2::2]
            self._record = replace(
                self._record, seq=self._record.seq + 1, updated_at=time.time(), elapsed_secs=round(elapsed, 3)
            )
            record = replace(self._record, samples=list(self._samples))
            self._dirty, self._last_write = False, self.clock()
        try:
            path = self.layout.attempt_progress(record.shard_id, record.attempt_id)
            # durable=False: a progress record lost in a crash only shows older progress
            fsio.atomic_write(path, record.encode(), durable=False)
        except (OSError, JobDirError) as exc:
            logger.warning(f"{record.shard_id}: could not write progress: {exc}")
            with self._lock:
                self._dirty = True
            return False
        return True

    def finish(self) -> None:
        """Final write when the attempt ends, whatever the outcome."""
        with self._lock:
            timer, self._timer, self.write_every = self._timer, None, None  # no timed write after the last
        if timer is not None:
            timer.cancel()
        self.set_stage(Stage.FINISHED)
        self.flush(force=True)


# The tracker of the attempt running in this thread's context: the worker loop sets it
# around run_shard, the shard runner (another package, same call stack) reports into it.
_current: contextvars.ContextVar[ProgressTracker | None] = contextvars.ContextVar("dj_elastic_progress", default=None)


def current() -> ProgressTracker | None:
    return _current.get()


@contextlib.contextmanager
def activate(tracker: ProgressTracker | None) -> Iterator[ProgressTracker | None]:
    token = _current.set(tracker)
    try:
        yield tracker
    finally:
        _current.reset(token)
