"""Heartbeats on shared storage: the one staleness rule (on the observer's own monotonic clock:
docs/leases-on-nfs.md, item 2), the one periodic thread (renewals, the summary's rounds, the
watchers), a claim's heartbeat and its renewal, and what a renewal carries: the attempt's signs of
life (the stall rule: docs/failure-semantics.md) and its live progress
(``attempts/<task>/<attempt>/progress.json``, docs/status.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import json
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field, replace
from typing import ClassVar, Final, NamedTuple, Protocol

from loguru import logger

from data_juicer_elastic.errors import JobDirError, clip
from data_juicer_elastic.jobdir.layout import JobLayout, check_inside, ensure_dir
from data_juicer_elastic.jobdir.records import Claim, Heartbeat, Record
from data_juicer_elastic.sharedfs import fsio

Clock = Callable[[], float]
MAX_SAMPLES: Final = 64  # samples kept per attempt; older ones are thinned, never all dropped
MAX_OPERATOR_CHARS: Final = 200
FIRST_WRITE_SECS: Final = 1.0  # an attempt's first change is written this long after it (write_every)


class Watched(Protocol):
    """One read of a heartbeat: which heartbeat (``watch_key``) and the value watched for change."""

    @property
    def watch_key(self) -> str: ...

    @property
    def watch_token(self) -> Hashable: ...


class Sighting(NamedTuple):
    """A :class:`Watched` for records that are not a lease view (a phase leader's heartbeat)."""

    watch_key: str
    watch_token: Hashable


class StalenessObserver:
    """Judges staleness on this observer's own clock (the Kubernetes leader-election rule)."""

    def __init__(self, ttl_secs: float, clock: Clock = time.monotonic):
        if ttl_secs <= 0:
            raise ValueError("ttl_secs must be > 0")
        self.ttl_secs = ttl_secs
        self.clock = clock
        self._seen: dict[str, tuple[Hashable, float]] = {}  # key -> (token, first seen on our clock)

    def observe(self, seen: Watched) -> float:
        """Record the sighting; return for how long (our clock) its value has been unchanged."""
        now = self.clock()
        previous = self._seen.get(seen.watch_key)
        if previous is None or previous[0] != seen.watch_token:
            self._seen[seen.watch_key] = (seen.watch_token, now)
            return 0.0
        return max(0.0, now - previous[1])

    def unchanged_for(self, key: str) -> float | None:
        """For how long (our clock) the last value seen for ``key`` has been unchanged; None when
        never observed.  Lets a claimer skip re-reading a held shard that could not be stale yet."""
        previous = self._seen.get(key)
        return None if previous is None else max(0.0, self.clock() - previous[1])

    def is_stale(self, seen: Watched) -> bool:
        """The heartbeat's value has not changed for ``ttl_secs`` on our clock (observes it too)."""
        return self.observe(seen) >= self.ttl_secs

    def forget(self, key: str) -> None:
        self._seen.pop(key, None)


class PeriodicThread:
    """Calls ``tick()`` every ``interval_secs`` from a daemon thread until :meth:`stop`, or until a
    tick returns False; ``first_tick`` ticks once on the starting thread first (a heartbeat is
    written at once).  A tick handles its own errors: one that escapes ends the thread."""

    def __init__(
        self,
        interval_secs: float,
        tick: Callable[[], object],
        name: str,
        *,
        join_secs: float | None = None,
        first_tick: bool = False,
    ):
        self.interval_secs, self.tick, self.name = interval_secs, tick, name
        self.join_secs, self.first_tick = join_secs, first_tick
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PeriodicThread:
        if self.first_tick:
            self.tick()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_secs):
            if self.tick() is False:
                return

    def stop(self) -> None:
        """Stop ticking; waits up to ``join_secs`` (None: until it ends) for a tick in flight,
        never for the calling thread."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.join_secs)


def looks_stale(age_secs: float | None, ttl_secs: object) -> bool:
    """The heartbeat file's mtime age is over the TTL: a display hint for readers without an
    observer, never a takeover's reason (mtimes come through caches, from the server's clock)."""
    return isinstance(ttl_secs, (int, float)) and age_secs is not None and age_secs > ttl_secs


def token_text(generation: int, heartbeat: Heartbeat | None, error: str | None) -> str:
    """The watched value of a generation's heartbeat (its sequence, or what made it unreadable)."""
    beat = ["seq", heartbeat.attempt_id, heartbeat.seq] if heartbeat is not None else ["none", error]
    return json.dumps([generation, *beat], separators=(",", ":"))


def read_heartbeat(layout: JobLayout, shard_id: str, generation: int) -> tuple[Heartbeat | None, str | None]:
    """(heartbeat, error) of one generation: what the summary writer reads of each live claim."""
    heartbeat, error = Heartbeat.read_or_error(layout.heartbeat(shard_id, generation))
    if heartbeat is not None and heartbeat.generation != generation:
        return None, "heartbeat of another generation"
    return heartbeat, error


def heartbeat_age(layout: JobLayout, shard_id: str, generation: int, now: float | None = None) -> float | None:
    """Seconds since the generation's heartbeat (before its first one: its claim) was written, by
    the files' mtimes: for display only, as :func:`heartbeats.looks_stale`."""
    now = time.time() if now is None else now
    for path in (layout.heartbeat(shard_id, generation), layout.claim(shard_id, generation)):
        try:
            return max(0.0, now - fsio.stat(path).st_mtime)
        except OSError:
            continue
    return None


def newer_generation_exists(layout: JobLayout, claim: Claim) -> bool:
    """Advisory fencing check: someone took over after us."""
    return fsio.exists(layout.claim(claim.shard_id, claim.generation + 1))


def write_heartbeat(layout: JobLayout, claim: Claim, seq: int, *, make_dir: bool = True) -> None:
    """Rewrite the generation's heartbeat.  ``make_dir=False`` once its directory exists: a renewal
    is then one write (the directory is still checked with ``lstat``s the client answers from cache)."""
    path = layout.heartbeat(claim.shard_id, claim.generation)
    if make_dir:
        ensure_dir(layout, path.parent)
    else:
        check_inside(layout, path.parent)
    # Durable=False: a heartbeat lost in a crash only makes the claim look older, which is safe.
    fsio.atomic_write(
        path, Heartbeat(claim.shard_id, claim.generation, claim.attempt_id, seq, time.time()).encode(), durable=False
    )


class Liveness:
    """Signs of life of one attempt, and what to do when there are none for too long."""

    def __init__(self, stall_secs: float, clock: Clock = time.monotonic):
        if not stall_secs > 0:
            raise ValueError("stall_secs must be > 0")
        self.stall_secs, self.clock = stall_secs, clock
        self._last, self._what = clock(), "the attempt started"
        self._armed = False
        self.stalled = threading.Event()
        self._callbacks: list[Callable[[], object]] = []
        self._lock = threading.Lock()

    def note(self, what: str) -> None:
        """A sign of life (any thread)."""
        self._last, self._what = self.clock(), what

    @contextlib.contextmanager
    def armed(self) -> Iterator[Liveness]:
        """Apply the stall rule while the block (the runner) runs."""
        self.note("the runner started")
        self._armed = True
        try:
            yield self
        finally:
            self._armed = False

    def quiet_for(self) -> float:
        return max(0.0, self.clock() - self._last)

    def is_stalled(self) -> bool:
        return self._armed and self.quiet_for() > self.stall_secs

    def describe(self) -> str:
        return f"no sign of life for {self.quiet_for():.0f}s (limit {self.stall_secs:g}s; last: {self._what})"

    def when_stalled(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` (from the heartbeat thread) once the attempt is declared stalled."""
        with self._lock:
            fire = self.stalled.is_set()
            if not fire:
                self._callbacks.append(callback)
        if fire:
            _call(callback)

    def declare_stalled(self) -> None:
        with self._lock:
            if self.stalled.is_set():
                return
            self.stalled.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _call(callback)


def _call(callback: Callable[[], object]) -> None:
    try:
        callback()
    except Exception as exc:  # giving the shard up must not depend on a restart succeeding
        logger.warning(f"stall handler failed: {type(exc).__name__}: {exc}")


class Heartbeater:
    """Renews one claim's heartbeat from a daemon thread; sets ``lost`` when renewal has failed for
    ``ttl - 2*heartbeat`` seconds or a newer generation exists.  :meth:`check` recomputes the
    deadline from the clock too, so a thread stuck in a hung NFS call cannot hide an expired lease."""

    def __init__(
        self,
        layout: JobLayout,
        claim: Claim,
        *,
        heartbeat_secs: float,
        ttl_secs: float,
        clock: Clock = time.monotonic,
        on_beat: Callable[[], object] | None = None,
        liveness: Liveness | None = None,
        on_stall: Callable[[str], object] | None = None,
    ):
        if not (0 < heartbeat_secs and 2 * heartbeat_secs < ttl_secs):
            raise ValueError("need 0 < heartbeat_secs < ttl_secs / 2")
        self.layout, self.claim = layout, claim
        self.heartbeat_secs, self.ttl_secs, self.clock = heartbeat_secs, ttl_secs, clock
        self.grace_secs = ttl_secs - 2 * heartbeat_secs
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self.seq = 0
        self.last_renewal = clock()
        # called after each successful renewal (live progress piggy-backs on the cadence);
        # it must not raise, and must be quick: the lease matters more than the display
        self.on_beat = on_beat
        # no renewal without signs of life; on_stall(reason) gives the shard up before the
        # liveness' own stall callbacks (the runner's restart) run
        self.liveness, self.on_stall = liveness, on_stall
        name, join_secs = f"heartbeat-{claim.shard_id}", max(1.0, heartbeat_secs)
        self._renewer = PeriodicThread(heartbeat_secs, self._renew, name, join_secs=join_secs, first_tick=True)
        self._dir_ready = False  # the heartbeat directory exists: renewals need no makedirs

    def _lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            logger.warning(f"{self.claim.shard_id} gen {self.claim.generation}: lease lost ({reason})")
            self.lost.set()

    def beat(self) -> bool:
        """One renewal; True when it was written and the claim is still ours."""
        if self.lost.is_set():
            return False
        if self.liveness is not None and self.liveness.is_stalled():
            self._stalled(f"stalled: {self.liveness.describe()}")
            return False
        try:
            if newer_generation_exists(self.layout, self.claim):
                self._lose("a newer generation was claimed")
                return False
            self.seq += 1
            try:
                write_heartbeat(self.layout, self.claim, self.seq, make_dir=not self._dir_ready)
            except FileNotFoundError:  # its directory was removed (retry archives a shard's records)
                write_heartbeat(self.layout, self.claim, self.seq, make_dir=True)
            self._dir_ready = True
        except OSError as exc:
            logger.warning(f"{self.claim.shard_id}: heartbeat failed: {exc}")
            self.check()
            return False
        self.last_renewal = self.clock()
        if self.on_beat is not None:
            try:
                self.on_beat()
            except Exception as exc:
                logger.warning(f"{self.claim.shard_id}: heartbeat hook failed: {exc}")
        return True

    def _stalled(self, reason: str) -> None:
        self._lose(reason)
        if self.on_stall is not None:
            try:
                self.on_stall(reason)
            except Exception as exc:  # the lease then simply expires after a TTL
                logger.warning(f"{self.claim.shard_id}: could not give the stalled shard up: {exc}")
        self.liveness.declare_stalled()

    def check(self) -> bool:
        """True while the lease is held; sets ``lost`` once renewal is overdue."""
        if not self.lost.is_set() and self.clock() - self.last_renewal > self.grace_secs:
            self._lose(f"no renewal for more than {self.grace_secs:g}s")
        return not self.lost.is_set()

    def held(self) -> bool:
        """:meth:`check`, and no newer generation exists (someone took over after us)."""
        return self.check() and not newer_generation_exists(self.layout, self.claim)

    def _renew(self) -> bool:
        self.beat()
        return self.check()

    def start(self) -> Heartbeater:
        self._renewer.start()
        return self

    def stop(self) -> None:
        self._renewer.stop()


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
        # the attempt's stall rule (Liveness), if any: the runner registers its probe and restart with it
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
