"""The worker: one loop over task kinds (a planned job's scans, the deduplication phases ``phases`` gives
(``dedup.phases``), then its shards), each kind's attempt
body on the task queue (``task_queue.TaskQueue.attempt``), the loop's settings, and its signals
(SIGTERM/SIGINT handed back as an exception in the main thread, so the loop releases what it holds,
then honoured as the signal would have been).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.errors import (
    ConfigError,
    LeaseLostError,
    WorkerInterrupted,
    is_worker_fault,
    storage_error,
)
from data_juicer_elastic.jobdir import shard_state
from data_juicer_elastic.jobdir.attempts import ScanOutput, ScanTask, ShardOutput, ShardTask, publish_done
from data_juicer_elastic.jobdir.claiming import AheadShard, ClaimAhead, Claimer
from data_juicer_elastic.jobdir.heartbeats import Liveness, ProgressTracker, Stage, activate
from data_juicer_elastic.jobdir.job_summary import HeldClaim, IdleBackoff, PaceWriter, SummaryReader, register_reader
from data_juicer_elastic.jobdir.layout import JobLayout, check_layout
from data_juicer_elastic.jobdir.manifest import (
    check_shard_file,
    check_shard_files,
    load_manifest,
    load_plan,
    normalise_options,
    publish_manifest,
    publish_scan,
    source_spans,
)
from data_juicer_elastic.jobdir.records import (
    AttemptExit,
    Claim,
    FailureReason,
    JobPlan,
    Manifest,
    PlannedShard,
    ReleaseReason,
    ShardEntry,
    StopReason,
)
from data_juicer_elastic.jobdir.roles import SummaryKeeper
from data_juicer_elastic.jobdir.shard_state import TerminalInfo, leaving_outcome
from data_juicer_elastic.jobdir.task_queue import AttemptScope, TaskQueue
from data_juicer_elastic.rows.codecs import SHARD_SUFFIX
from data_juicer_elastic.rows.shard_source import ShardSource
from data_juicer_elastic.settings import ElasticSettings, check_values
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

RunShard = Callable[[ShardTask], ShardOutput]
RunScan = Callable[[ScanTask], ScanOutput]
# Claim ahead once the running shard is expected to be this far through: the next shard is then
# held for about a fifth of a shard's time, not a whole one, while another node may be idle.
TAIL_FRACTION: Final = 0.8
# The live progress record is rewritten every other heartbeat: a renewal stays one write, and a
# display is at most two heartbeats behind.
PROGRESS_EVERY_BEATS: Final = 2
# A change of the live progress is written at most this often (or every heartbeat, if shorter), so
# `status` sees the rows of an attempt shorter than the heartbeats while it runs (docs/status.md).
PROGRESS_WRITE_SECS: Final = 5.0


@dataclass(frozen=True)
class WorkerSettings:
    """What one worker loop holds to: its leases, its pace, its limits."""

    ttl_secs: float  # a claim whose heartbeat has not changed for this long is taken over
    heartbeat_secs: float  # how often the held claims' heartbeats are renewed
    max_retries: int  # retries after a shard's first failed attempt; then it is terminally failed
    poll_interval_secs: float  # how often an idle worker looks again (the summary may make it wait longer)
    max_shards: int | None = None  # stop after claiming this many shards (None: no limit)
    # stop once this many of this worker's results were accepted (strict mode's share): unlike
    # max_shards a failed attempt does not use it up (None: no limit)
    max_done: int | None = None
    # deaths of a shard's holders (killed, lease expired, stalled) that fail it, apart from max_retries
    max_holder_deaths: int | None = None  # None: never
    # give a shard up when its attempt shows no sign of life for this long (heartbeats.Liveness)
    stall_timeout_secs: float | None = None  # None: a heartbeat means alive
    wait_for_completion: bool = True  # with nothing claimable, wait for the shards others hold (else no-work)
    claim_ahead: bool = True  # in a shard's tail, claim the next one and check its input (claiming.ClaimAhead)
    random_start: bool = False  # start looking at a random shard (fresh workers spread out), else at the first
    job_summary: bool = True  # keep and read the job summary (jobdir.job_summary) instead of every shard

    def __post_init__(self) -> None:
        values: dict[str, Any] = {
            "lease_ttl_secs": self.ttl_secs,
            "heartbeat_interval_secs": self.heartbeat_secs,
            "max_retries": self.max_retries,
            "poll_interval_secs": self.poll_interval_secs,
            "max_shards": self.max_shards,
        }
        limits = {"max_holder_deaths": self.max_holder_deaths, "stall_timeout_secs": self.stall_timeout_secs}
        # the settings' own rules (a caller may pass plain values); None is "no limit" for the last two
        check_values(values | {name: value for name, value in limits.items() if value is not None})
        if self.max_done is not None and (isinstance(self.max_done, bool) or self.max_done < 1):
            raise ConfigError(f"invalid value {self.max_done!r}: must be >= 1 or null", where="max_done")

    @classmethod
    def from_elastic(cls, settings: ElasticSettings, **values: Any) -> WorkerSettings:
        """The values ``settings`` holds (``heartbeat_secs``: its interval, else a quarter of the
        TTL); ``values`` adds those only the caller knows (``max_done``, ``wait_for_completion``,
        ``random_start``, ``job_summary``)."""
        return cls(
            ttl_secs=settings.lease_ttl_secs, heartbeat_secs=settings.heartbeat_secs, max_retries=settings.max_retries,
            poll_interval_secs=settings.poll_interval_secs, max_shards=settings.max_shards,
            max_holder_deaths=settings.max_holder_deaths, stall_timeout_secs=settings.stall_timeout_secs,
            claim_ahead=settings.claim_ahead, **values,
        )  # fmt: skip

    def queue(self, layout: JobLayout, identity: WorkerIdentity, clock: Callable[[], float], pace=None) -> TaskQueue:
        """The task queue of ``layout``'s namespace under these leases and budgets."""
        return TaskQueue(
            layout, identity, ttl_secs=self.ttl_secs, heartbeat_secs=self.heartbeat_secs, clock=clock,
            max_retries=self.max_retries, max_holder_deaths=self.max_holder_deaths, pace=pace,
        )  # fmt: skip


@dataclass
class WorkerSummary:
    claimed: int = 0  # claims this worker won (failed ones count)
    done: int = 0  # results of this worker that were accepted
    discarded: int = 0  # finished, but another attempt had published first
    failed: int = 0  # attempts of this worker that failed
    lost: int = 0  # attempts abandoned because the lease was lost
    terminal_failures: list[TerminalInfo] = field(default_factory=list)  # (shard_id, last_error), whole job
    complete: bool = False  # every shard of the job is done
    stop_reason: StopReason | str = ""  # empty until the loop stops
    unrun: int = 0  # claimed ahead, then handed back without running (not attempts: counted nowhere else)


class Scans:
    """The scan kind: a planned job's shards each read once (``scans/``) until the manifest exists
    (docs/input-format.md; fault row 30 of docs/failure-semantics.md)."""

    label = " (scanning)"

    def __init__(self, queue: TaskQueue, run_scan: RunScan, poll_secs: float, stop_event=None, rng=None):
        self.queue, self.run_scan, self.stop_event = queue, run_scan, stop_event
        self.layout = JobLayout(queue.layout.root)  # the job's own: its plan and manifest
        self.plan = load_plan(self.layout.root)
        self.claimer = Claimer(queue, self.plan, rng=rng, random_start=True)
        self.options = normalise_options(self.plan, max_line_bytes=self.plan.max_line_bytes)
        self.poll_secs = poll_secs
        self.manifest: Manifest | None = None  # once every shard is scanned

    def stop_reason(self) -> StopReason | None:
        if fsio.exists(self.layout.manifest):
            self.manifest = load_manifest(self.layout.root)
            return StopReason.FINISHED
        return StopReason.STOPPED if self.stop_event is not None and self.stop_event.is_set() else None

    def claim(self) -> tuple[tuple[PlannedShard, Claim] | None, bool]:
        claimed, finished = self.claimer.claim_next()
        if finished:
            self.manifest = settle_scans(self.layout, self.plan)
        return claimed, finished

    def idle_secs(self) -> float:
        return self.poll_secs

    def run(self, entry: PlannedShard, claim: Claim) -> None:
        heartbeater = self.queue.heartbeater(claim)
        heartbeater.start()
        with self.queue.attempt(claim, heartbeater, f"scan of {entry.shard_id}", on_exit=self._exited) as scope:
            attempt = scope.open()
            codec, copy = self.plan.shard_codec, None
            if self.plan.copy_shards:
                copy = self.queue.layout.attempt_copy(entry.shard_id, claim.attempt_id, SHARD_SUFFIX[codec])
            spans = source_spans(self.plan.inputs, entry.spans)
            task = ScanTask(entry.shard_id, spans, self.options, attempt.dir, copy, codec)
            started = time.time()
            output = self.run_scan(task)
            scope.fence()
            accepted, _ = publish_scan(self.layout, claim, attempt.dir, output, self.queue.identity, started)
            scope.ended(accepted, output)

    def _exited(self, scope: AttemptScope, exc: BaseException | None) -> None:
        if exc is None:
            output, shard = scope.result, scope.claim.shard_id
            self.claimer.learn_done(shard)
            what = f"refused ({output.refusal.message})" if output.refusal else f"{output.rows} rows"
            logger.info(f"scanned {shard}: {what}, {output.bytes} bytes")

    def interrupted(self) -> None:
        self.queue.release_pending()  # signalled holding a scan's claim (a begun attempt released it already)

    def close(self, reason: StopReason | None) -> None:
        close = getattr(self.run_scan, "close", None)
        if close is not None:
            close()  # e.g. its row-checking helper processes


def settle_scans(layout: JobLayout, plan: JobPlan) -> Manifest:
    """Every shard's scan has ended: the job's input error, a spent scan budget, or the manifest."""
    error, results = shard_state.scans_verdict(layout, plan)
    if error is not None:
        raise error
    manifest = publish_manifest(layout, plan, results)
    logger.info(f"scanned {layout.root}: {manifest.total_rows} rows in {manifest.num_shards} shards")
    return manifest


class Shards:
    """The shard kind: the job's shards claimed (the next one ahead, in a shard's tail) and run; the
    job summary kept (``keeper``, driven by ``drive_keeper``) while the loop runs."""

    label = ""

    def __init__(
        self, queue: TaskQueue, manifest: Manifest, claimer: Claimer, run_shard: RunShard, settings: WorkerSettings,
        summary: WorkerSummary, *, ahead: ClaimAhead | None = None, keeper: SummaryKeeper | None = None,
        drive_keeper: Callable[[SummaryKeeper], Callable[[], object]] | None = None,
        on_attempt: Callable[[ProgressTracker], None] | None = None, stop_event: threading.Event | None = None,
        drops: Callable[[str], dict] | None = None,
    ):  # fmt: skip
        self.queue, self.layout, self.manifest, self.claimer = queue, queue.layout, manifest, claimer
        self.drops = drops or (lambda shard: {})  # a shard's drop lists (ShardTask.drops), when the recipe deduplicates
        self.run_shard, self.settings, self.summary, self.clock = run_shard, settings, summary, queue.clock
        self.ahead, self.keeper, self.on_attempt, self.stop_event = ahead, keeper, on_attempt, stop_event
        self.pulse = drive_keeper(keeper) if keeper is not None else lambda: None  # a keeper round, when due
        self.idle = IdleBackoff(settings.poll_interval_secs, claimer.summary)
        self.secs_per_row: float | None = None  # of this worker's last finished shard: when the next one's tail starts

    def stop_reason(self, running: int = 0) -> StopReason | None:
        """Why the loop must stop now; ``running``: count that many more shards done (a shard
        claimed ahead only when the limits would let this worker run it next)."""
        settings = self.settings
        if self.stop_event is not None and self.stop_event.is_set():
            return StopReason.STOPPED
        if settings.max_shards is not None and self.summary.claimed >= settings.max_shards:
            return StopReason.MAX_SHARDS
        if settings.max_done is not None and self.summary.done + running >= settings.max_done:
            return StopReason.MAX_DONE
        return None

    def claim(self) -> tuple[tuple | None, bool]:
        self.pulse()
        # A shard claimed ahead while the last one ran comes first (its claim, check and read are done).
        ahead = self.ahead.take() if self.ahead is not None else None
        claimed, finished = ((ahead.entry, ahead.claim, ahead), False) if ahead else self.claimer.claim_next()
        if claimed is not None:
            self.idle.reset()
        return claimed, finished

    def idle_secs(self) -> float:
        if self.queue.pace is not None:
            self.queue.pace.flush()  # what we finished last is in the summary while we wait
        return self.idle.next_wait()

    def in_tail(self, tracker: ProgressTracker) -> bool:
        """The running shard is expected to be in its last part (``TAIL_FRACTION``), by the time per
        row of this worker's last shard; for its first, once its output rows reach that part of its
        input (Ray Data's rows read say nothing: the runner reads a shard whole before processing)."""
        record = tracker.current
        if self.secs_per_row is None:
            return record.rows_written >= TAIL_FRACTION * record.rows_total
        return record.elapsed_secs >= TAIL_FRACTION * self.secs_per_row * record.rows_total

    def run(self, entry: ShardEntry, claim: Claim, ahead: AheadShard | None = None) -> None:
        """Run one claimed shard (``ahead``: claimed ahead, its input checked then); meanwhile the next
        is claimed ahead."""
        self.summary.claimed += 1
        began = self.clock()
        write_every = min(PROGRESS_WRITE_SECS, self.queue.heartbeat_secs)
        tracker = ProgressTracker(self.layout, claim, entry.rows, write_every=write_every)
        if self.on_attempt is not None:
            self.on_attempt(tracker)  # e.g. a terminal progress bar for this shard
        stall = self.settings.stall_timeout_secs
        alive = None if stall is None else Liveness(stall, self.clock)
        if alive is not None:  # every change of the live progress is a sign of life
            tracker.listeners.append(lambda record: alive.note(f"{record.stage}, {record.rows_written} rows out"))
            tracker.liveness = alive  # the runner finds it there (heartbeats.current())
        heartbeater = self.queue.heartbeater(
            claim, on_beat=_every(PROGRESS_EVERY_BEATS, tracker.flush), liveness=alive,
            on_stall=lambda reason: self._give_up(claim, reason),
        )  # fmt: skip
        heartbeater.start()
        on_exit = lambda scope, exc: self._exited(entry, began, scope, exc)  # noqa: E731
        with self.queue.attempt(
            claim, heartbeater, claim.shard_id, worker_fault=is_worker_fault, on_exit=on_exit
        ) as scope:
            try:
                # claimed ahead: its file was checked (and read) while the last shard ran, and is unchanged
                prechecked = ahead is not None and ahead.still_checked(self.layout)
                attempt = scope.open()
                tracker.start_writing()
                # a link out of the job dir is never read, a changed input never run
                source = ahead.checked[0] if prechecked else check_shard_file(self.layout, self.manifest, entry)
                task = ShardTask(
                    shard_id=entry.shard_id, source=source, attempt_dir=attempt.dir, generation=claim.generation,
                    attempt_id=claim.attempt_id, input_rows=entry.rows, input_sha256=entry.sha256,
                    read_ahead=ahead.read if prechecked else None, drops=self.drops(entry.shard_id),
                )  # fmt: skip
                if self.ahead is not None and self.stop_reason(running=1) is None:  # claimed counts this one
                    # the next shard's claim, check and read overlap this one's tail (see claiming.ClaimAhead)
                    self.ahead.start(in_tail=lambda: self.in_tail(tracker))
                with activate(tracker), alive.armed() if alive else nullcontext():
                    started = self.clock()
                    output = self.run_shard(task) if entry.rows else empty_output(task)
                    self.secs_per_row = (self.clock() - started) / max(entry.rows, 1)
                if self.ahead is not None:
                    self.ahead.run_ended()  # the next claim overlaps this shard's publication
                tracker.set_stage(Stage.PUBLISHING)
                scope.fence()
                outcome = publish_done(
                    self.layout, claim, output.output_path, input_rows=entry.rows, input_sha256=entry.sha256,
                    declared_rows=output.rows, declared_bytes=output.bytes, declared_sha256=output.sha256,
                    stats_path=output.stats_path, row_stats_path=output.row_stats_path, errors_path=output.errors_path,
                )  # fmt: skip
                errors = outcome.result.errors
                scope.ended(outcome.accepted, outcome, rows=outcome.result.rows, quarantined=errors and errors.rows)
            finally:
                tracker.finish()

    def _exited(self, entry: ShardEntry, began: float, scope: AttemptScope, exc: BaseException | None) -> None:
        claim = scope.claim
        if exc is None:
            # Publishing never waits for the claim-ahead helper; the Claimer is ours again once its claim
            # is made (with the summary it gives up at once when nothing is claimable).
            if self.ahead is not None:
                self.ahead.wait_claimed()
            outcome = scope.result
            if outcome.accepted and self.queue.pace is not None:
                quarantined = outcome.result.errors.rows if outcome.result.errors is not None else 0
                held = HeldClaim(claim.shard_id, claim.generation, claim.attempt_id)
                self.queue.pace.finished(self.clock() - began, outcome.result.rows, entry.rows, quarantined, shard=held)
            if outcome.accepted or outcome.winner is not None:
                self.claimer.learn_done(entry.shard_id)
            if outcome.accepted:
                self.summary.done += 1
                logger.info(f"{entry.shard_id}: done ({outcome.result.rows} rows) by attempt {claim.attempt_id}")
            else:
                self.summary.discarded += 1
            return
        # The shard did not finish: hand the shard claimed ahead back at once (this worker retries its own first).
        if scope.exit is AttemptExit.SIGNAL:
            signalled = isinstance(exc, WorkerInterrupted | KeyboardInterrupt)
            self._drop_ahead("interrupted", ReleaseReason.SIGNAL if signalled else ReleaseReason.UNRUN, wait_secs=0.0)
            return
        lost = isinstance(exc, LeaseLostError)
        self._drop_ahead(
            f"{claim.shard_id} lost its lease" if lost else f"{claim.shard_id} did not finish: {type(exc).__name__}"
        )
        if scope.exit is AttemptExit.LOST:
            self.summary.lost += 1
        elif scope.exit is AttemptExit.FAILED:
            self.summary.failed += 1
            self.claimer.cursor.position = self.claimer.index[claim.shard_id]  # the next walk retries it first

    def _drop_ahead(self, why: str, reason=ReleaseReason.UNRUN, wait_secs: float | None = None) -> None:
        """Waits ``wait_secs`` (None: until done) for a claim in flight."""
        if self.ahead is not None:
            self.ahead.release(reason, why=why, wait_secs=wait_secs)

    def _give_up(self, claim: Claim, reason: str) -> None:
        """The attempt stalled (heartbeat thread): record it as a holder death and release the
        claim now, so another worker takes the shard without waiting a TTL."""
        logger.error(f"{claim.shard_id}: giving up attempt {claim.attempt_id}: {reason}")
        # before the runtime watch restarts (execs) this process: a claim in flight is released too
        self._drop_ahead(f"{claim.shard_id} stalled", wait_secs=self.queue.heartbeat_secs)
        try:
            self.queue.fail(claim, claim.shard_id, claim.generation, reason, "ShardStalled", FailureReason.STALLED)
        finally:
            self.queue.release(claim, ReleaseReason.STALLED)

    def interrupted(self) -> None:
        self.queue.release_pending()  # signalled holding a claim (a begun attempt released it already)
        if self.ahead is not None:  # and the shard claimed ahead (a claim in flight: once made)
            self.ahead.close(ReleaseReason.SIGNAL, why="signal", wait_secs=self.queue.heartbeat_secs)

    def close(self, reason: StopReason | None) -> None:
        """Every other way out (a stop, a limit, an error): nothing stays claimed ahead."""
        if self.ahead is not None:
            self.ahead.close(ReleaseReason.UNRUN, why=f"worker stopping: {reason or 'error'}")
            self.summary.unrun = self.ahead.unrun
        if self.keeper is not None:
            self.keeper.stop()  # a last round, and the writer's lease released for the next writer


def _every(n: int, call: Callable[[], object]) -> Callable[[], object]:
    """``call`` on every ``n``-th invocation, the first included."""
    counter = itertools.count()
    return lambda: call() if next(counter) % n == 0 else None


def empty_output(task: ShardTask) -> ShardOutput:
    """The output of a shard without rows (a unit larger than its share left it empty, ``shards.plan``):
    nothing to run, an empty file to publish."""
    fsio.write_new(task.output_path, b"")
    return ShardOutput(task.output_path, 0)


def keeper_thread(keeper: SummaryKeeper) -> Callable[[], object]:
    """The job summary kept from its own thread, on the real clock (every worker process)."""
    keeper.start()
    return lambda: None


def keeper_in_loop(keeper: SummaryKeeper) -> Callable[[], object]:
    """The job summary kept from the worker loop, a round when due on the keeper's clock (an injected clock)."""
    return keeper.tick_if_due


def run_loop(kind: Scans | Shards, *, wait: bool, sleep: Callable[[float], object]) -> StopReason:
    """Claim and run tasks of one kind until it stops (a limit, a stop, nothing left, nothing now)."""
    while (reason := kind.stop_reason()) is None:
        claimed, finished = kind.claim()
        if claimed is not None:
            kind.run(*claimed)
            # the attempt left its records; until here a signal (say, while the claim-ahead helper is
            # waited for after publication) releases the claim from the loop's handler
            kind.queue.pending = None
        elif finished:
            return StopReason.FINISHED
        elif not wait:
            return StopReason.NO_WORK
        else:
            sleep(kind.idle_secs())
    return reason


def work(kind: Scans | Shards, *, wait: bool, sleep: Callable[[float], object], places=()) -> StopReason:
    """:func:`run_loop` under SIGTERM/SIGINT: a signal releases what is claimed and is honoured; a
    storage error is one clear error naming the path instead of a traceback."""
    reason: StopReason | None = None
    with SignalGuard() as guard:
        try:
            reason = run_loop(kind, wait=wait, sleep=sleep)
        except OSError as exc:
            # The job directory refused a write the loop cannot do without (claim, failure record).
            raise storage_error(exc, kind.layout.root, places=places) from exc
        except WorkerInterrupted as interrupt:
            # The guard stays installed meanwhile: a second SIGTERM (a scheduler's repeat, a
            # process group's) is absorbed instead of killing the worker before it released.
            kind.interrupted()
            logger.warning(f"worker stopping on signal {interrupt.signum}{kind.label}")
            honour(guard, interrupt.signum)
            reason = StopReason.INTERRUPTED  # the previous handler chose not to exit
        finally:
            kind.close(reason)
    return reason


def scan_job(
    layout: JobLayout, identity: WorkerIdentity, run_scan: RunScan, *, ttl_secs: float, heartbeat_secs: float,
    max_retries: int, poll_interval_secs: float, max_holder_deaths: int | None = None,
    stop_event: threading.Event | None = None, clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] | None = None, rng: random.Random | None = None, wait: bool = True,
) -> Manifest | None:  # fmt: skip
    """Scan shards of a planned job until its manifest exists (``dj-elastic prepare --scan``); the manifest
    (None when stopped first, or, with ``wait`` False, when nothing was left to claim while others scan)."""
    if fsio.exists(layout.manifest):
        return load_manifest(layout.root)
    queue = TaskQueue(
        layout.scans, identity, ttl_secs=ttl_secs, heartbeat_secs=heartbeat_secs, clock=clock,
        max_retries=max_retries, max_holder_deaths=max_holder_deaths,
    )  # fmt: skip
    kind = Scans(queue, run_scan, poll_interval_secs, stop_event, rng)
    try:
        run_loop(kind, wait=wait, sleep=sleep or _sleeper(stop_event))
    except (WorkerInterrupted, KeyboardInterrupt):
        kind.interrupted()
        raise
    finally:
        kind.close(None)
    return kind.manifest


def _sleeper(stop_event: threading.Event | None) -> Callable[[float], object]:
    return stop_event.wait if stop_event is not None else time.sleep


def run_worker(
    job_dir: str | Path, identity: WorkerIdentity, run_shard: RunShard, settings: WorkerSettings, *,
    stop_event: threading.Event | None = None, clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] | None = None, claim_gate: Callable[[], bool] | None = None,
    claim_rng: random.Random | None = None, on_attempt: Callable[[ProgressTracker], None] | None = None,
    before_claim: Callable[[], bool] | None = None, read_ahead: Callable[[ShardSource], object] | None = None,
    run_scan: RunScan | None = None, drive_keeper: Callable[[SummaryKeeper], Callable[[], object]] = keeper_thread,
    phases: Callable[..., Any] | None = None,
) -> WorkerSummary:  # fmt: skip
    """Process the shards of ``job_dir`` (a planned job's scans first, with ``run_scan``) until the job is
    finished or a limit of ``settings`` is reached; the arguments: docs/architecture.md, ``jobdir.worker``."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    summary, sleep, wait = WorkerSummary(), sleep or _sleeper(stop_event), settings.wait_for_completion
    manifest = None
    if run_scan is not None and not fsio.exists(layout.manifest) and fsio.exists(layout.plan):
        check_layout(layout)
        kind = Scans(settings.queue(layout.scans, identity, clock), run_scan, settings.poll_interval_secs,
                     stop_event, claim_rng)  # fmt: skip
        reason = work(kind, wait=wait, sleep=sleep)
        if kind.manifest is None:  # stopped, or nothing to scan here and no waiting, before the input was known
            summary.stop_reason = reason
            return summary
        manifest = kind.manifest
    # refuse a corrupt job before claiming anything (the scans' manifest was loaded and checked so)
    manifest = manifest or load_manifest(layout.root)
    check_layout(layout)  # and one whose directories lead elsewhere
    check_shard_files(layout.root, manifest)
    # the deduplication phases of the recipe's stages (dedup.phases.dedup_phases), each published before the shards
    dedup = phases and phases(layout, manifest, lambda tasks: settings.queue(tasks, identity, clock),
                              poll_secs=settings.poll_interval_secs, stop_event=stop_event)  # fmt: skip
    if dedup is not None and (reason := dedup.work(wait=wait, sleep=sleep)) is not StopReason.FINISHED:
        summary.stop_reason = reason
        return summary
    reader = pace = keeper = None
    if settings.job_summary:
        reader = SummaryReader(layout, manifest, ttl_secs=settings.ttl_secs, clock=clock)
        register_reader(reader)
        pace = PaceWriter(layout, identity)
    queue = settings.queue(layout, identity, clock, pace)
    claimer = Claimer(
        queue, manifest, claim_gate=claim_gate, rng=claim_rng, before_claim=before_claim,
        random_start=settings.random_start, summary_reader=reader,
    )  # fmt: skip
    if reader is not None:
        keeper = SummaryKeeper(layout, manifest, identity, pace, reader, ttl_secs=settings.ttl_secs,
                               heartbeat_secs=settings.heartbeat_secs, clock=clock)  # fmt: skip
    ahead = ClaimAhead(queue, manifest, claimer.claim_next, read_ahead) if settings.claim_ahead else None
    kind = Shards(queue, manifest, claimer, run_shard, settings, summary, ahead=ahead, keeper=keeper,
                  drive_keeper=drive_keeper, on_attempt=on_attempt, stop_event=stop_event,
                  drops=dedup.shard_drops if dedup else None)  # fmt: skip
    summary.stop_reason = work(kind, wait=wait, sleep=sleep, places=(("job directory", layout.root),))
    summary.complete, summary.terminal_failures = leaving_outcome(
        layout, manifest, claimer.known_done, None if summary.stop_reason == StopReason.FINISHED else reader
    )
    return summary


class SignalGuard:
    """Turns SIGTERM/SIGINT into WorkerInterrupted while the loop runs (main thread only)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.previous: dict[int, object] = {}
        self.pending: int | None = None

    def _handler(self, signum: int, frame: object) -> None:
        if self.pending is None:  # a second signal while we clean up is absorbed
            self.pending = signum
            raise WorkerInterrupted(signum)

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                previous = signal.getsignal(sig)
                if previous is signal.SIG_IGN:
                    continue  # the parent asked us to ignore it; keep doing so
                self.previous[sig] = previous
                signal.signal(sig, self._handler)
        return self

    def restore(self) -> None:
        for sig, previous in self.previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)

    def __exit__(self, *exc_info: object) -> None:
        self.restore()


def is_guard_handler(handler: object) -> bool:
    """Whether ``handler`` is a SignalGuard's: what a library that installs its own SIGTERM
    handler (Ray, at every ``ray.init``) must leave in place (``compat.ray_internals``)."""
    return getattr(handler, "__func__", None) is SignalGuard._handler


def honour(guard: SignalGuard, signum: int) -> None:
    """Restore the previous handlers and do what the signal would have done without us."""
    guard.restore()
    previous = guard.previous.get(signum)
    if callable(previous):
        previous(signum, None)  # e.g. default_int_handler raises KeyboardInterrupt
        return
    if previous in (signal.SIG_DFL, None):
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # terminates with the signal's status, as the scheduler expects
        time.sleep(1.0)
    raise SystemExit(128 + signum)
