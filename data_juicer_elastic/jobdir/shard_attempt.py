"""One worker's shards, each from its claim to its last record: run, fence, publish, release.  Every
way out of an attempt leaves a result, a failure or (on SIGTERM/SIGINT) a release.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Final

from loguru import logger

from data_juicer_elastic.errors import LeaseLostError, WorkerInterrupted, is_worker_fault, storage_error
from data_juicer_elastic.jobdir import attempts, claiming, leases, liveness, progress
from data_juicer_elastic.jobdir.claim_ahead import AheadShard, ClaimAhead
from data_juicer_elastic.jobdir.heartbeats import StalenessObserver
from data_juicer_elastic.jobdir.job_summary import HeldClaim, PaceWriter
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import check_shard_file
from data_juicer_elastic.jobdir.records import (
    AttemptExit,
    Claim,
    FailureReason,
    Manifest,
    ReleaseReason,
    ShardEntry,
    StopReason,
)
from data_juicer_elastic.jobdir.shard_state import TerminalInfo
from data_juicer_elastic.jobdir.tasks import ShardOutput, ShardTask
from data_juicer_elastic.jobdir.worker_settings import WorkerSettings
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

RunShard = Callable[[ShardTask], ShardOutput]
# Claim ahead once the running shard is expected to be this far through: the next shard is then
# held for about a fifth of a shard's time, not a whole one, while another node may be idle.
TAIL_FRACTION: Final = 0.8
# The live progress record is rewritten every other heartbeat: a renewal stays one write, and a
# display is at most two heartbeats behind.
PROGRESS_EVERY_BEATS: Final = 2
# A change of the live progress is written at most this often (or every heartbeat, if shorter), so
# `status` sees the rows of an attempt shorter than the heartbeats while it runs (docs/status.md).
PROGRESS_WRITE_SECS: Final = 5.0


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


class ShardWorker:
    """One worker's claimer, and the run of each shard it claims (every way out leaves a record)."""

    def __init__(self, layout, manifest, identity, run_shard, summary, settings: WorkerSettings, clock, **claim):
        self.layout: JobLayout = layout
        self.manifest: Manifest = manifest
        self.identity: WorkerIdentity = identity
        self.run_shard: RunShard = run_shard
        self.summary: WorkerSummary = summary
        self.clock, self.heartbeat = clock, settings.heartbeat_secs
        self.lease = {"heartbeat_secs": settings.heartbeat_secs, "ttl_secs": settings.ttl_secs, "clock": clock}
        self.on_attempt: Callable[[progress.ProgressTracker], None] | None = None
        self.stall_secs = settings.stall_timeout_secs
        self.secs_per_row: float | None = None  # of this worker's last finished shard: when the next one's tail starts
        self.claimer = claiming.Claimer(
            layout, manifest, identity, StalenessObserver(settings.ttl_secs, clock), max_retries=settings.max_retries,
            max_holder_deaths=settings.max_holder_deaths, random_start=settings.random_start, **claim,
        )  # fmt: skip
        self.ahead: ClaimAhead | None = None  # claim-ahead (jobdir.claim_ahead), when on
        self.pace: PaceWriter | None = None  # this process's pace record (jobdir.pace), with the job summary
        self.may_claim_ahead: Callable[[], bool] = lambda: False

    def claim_next(self) -> tuple[tuple[ShardEntry, Claim] | None, bool]:
        """(entry, claim) for a claimable shard we won, else (None, all shards finished)."""
        found, finished = self.claimer.claim_next()
        if found is not None and self.pace is not None:  # the summary's writer learns of it from our record
            claim = found[1]
            self.pace.holding(claim.shard_id, claim.generation, claim.attempt_id)
            self.pace.flush()
        return found, finished

    def let_go(self, claim: Claim, reason: ReleaseReason) -> None:
        """Our pace record no longer lists the claim; written at once unless the shard is finished
        (its done marker tells the summary; the next claim's write carries the change)."""
        if self.pace is not None:
            self.pace.let_go(claim.shard_id, claim.generation)
            if reason is not ReleaseReason.FINISHED:
                self.pace.flush()

    def in_tail(self, tracker: progress.ProgressTracker) -> bool:
        """The running shard is expected to be in its last part (``TAIL_FRACTION``), by the time per
        row of this worker's last shard; for its first, once its output rows reach that part of its
        input (Ray Data's rows read say nothing: the runner reads a shard whole before processing)."""
        record = tracker.current
        if self.secs_per_row is None:
            return record.rows_written >= TAIL_FRACTION * record.rows_total
        return record.elapsed_secs >= TAIL_FRACTION * self.secs_per_row * record.rows_total

    def take_ahead(self) -> tuple[ShardEntry, Claim, AheadShard] | None:
        """The shard claimed ahead while the last one ran, if any (and its lease still held)."""
        if self.ahead is None:
            return None
        # pending from the hand-over on: a signal releases it as any claimed-but-not-run shard
        ahead = self.ahead.take(hand_over=lambda claim: setattr(self.claimer, "pending", claim))
        return None if ahead is None else (ahead.entry, ahead.claim, ahead)

    def _drop_ahead(
        self, why: str, reason: ReleaseReason = ReleaseReason.UNRUN, wait_secs: float | None = None
    ) -> None:
        """The current shard did not finish: hand the shard claimed ahead back at once (this worker
        retries its own first).  Waits ``wait_secs`` (None: until done) for a claim in flight."""
        if self.ahead is not None:
            self.ahead.release(reason, why=why, wait_secs=wait_secs)

    def run(self, entry: ShardEntry, claim: Claim, ahead: AheadShard | None = None) -> None:
        """Run one claimed shard; every way out leaves a result, a failure or a release.  ``ahead``:
        it was claimed ahead and its input file checked then.  Meanwhile the next is claimed ahead."""
        self.summary.claimed += 1
        began = self.clock()
        write_every = min(PROGRESS_WRITE_SECS, self.heartbeat)
        tracker = progress.ProgressTracker(self.layout, claim, entry.rows, write_every=write_every)
        if self.on_attempt is not None:
            self.on_attempt(tracker)  # e.g. a terminal progress bar for this shard
        alive = None if self.stall_secs is None else liveness.Liveness(self.stall_secs, self.clock)
        if alive is not None:  # every change of the live progress is a sign of life
            tracker.listeners.append(lambda record: alive.note(f"{record.stage}, {record.rows_written} rows out"))
            tracker.liveness = alive  # the runner finds it there (progress.current())
        heartbeater = leases.Heartbeater(
            self.layout,
            claim,
            **self.lease,
            on_beat=_every(PROGRESS_EVERY_BEATS, tracker.flush),
            liveness=alive,
            on_stall=lambda reason: self._give_up(claim, reason),
        )
        heartbeater.start()
        attempt: attempts.Attempt | None = None
        try:
            # claimed ahead: its file was checked (and read) while the last shard ran, and is unchanged
            prechecked = ahead is not None and ahead.still_checked(self.layout)
            attempt = attempts.open_attempt(self.layout, claim, self.identity)
            tracker.start_writing()
            if prechecked:
                source = ahead.checked[0]
            else:  # a link out of the job dir is never read, a changed input never run
                source = check_shard_file(self.layout, self.manifest, entry)
            task = ShardTask(
                shard_id=entry.shard_id,
                source=source,
                attempt_dir=attempt.dir,
                generation=claim.generation,
                attempt_id=claim.attempt_id,
                input_rows=entry.rows,
                input_sha256=entry.sha256,
                read_ahead=ahead.read if prechecked else None,
            )
            if self.ahead is not None and self.may_claim_ahead():
                # the next shard's claim, check and read overlap this one's tail (see claim_ahead)
                self.ahead.start(in_tail=lambda: self.in_tail(tracker))
            with progress.activate(tracker), alive.armed() if alive else nullcontext():
                started = self.clock()
                output = self.run_shard(task) if entry.rows else empty_output(task)
                self.secs_per_row = (self.clock() - started) / max(entry.rows, 1)
            if self.ahead is not None:
                self.ahead.run_ended()  # the next claim overlaps this shard's publication
            tracker.set_stage(progress.Stage.PUBLISHING)
            self._fence(heartbeater, claim)
            outcome = attempts.publish_done(
                self.layout,
                claim,
                output.output_path,
                input_rows=entry.rows,
                input_sha256=entry.sha256,
                declared_rows=output.rows,
                declared_bytes=output.bytes,
                declared_sha256=output.sha256,
                stats_path=output.stats_path,
                row_stats_path=output.row_stats_path,
                errors_path=output.errors_path,
            )
        except LeaseLostError as exc:
            self._drop_ahead(f"{claim.shard_id} lost its lease")
            self._abandon(attempt, claim, exc.message)
            return
        except Exception as exc:
            heartbeater.stop()
            self._drop_ahead(f"{claim.shard_id} did not finish: {type(exc).__name__}")
            if is_worker_fault(exc):
                # This worker's set-up is wrong (different code, no Ray): the shard is
                # not to blame, so hand it back without spending its retry budget.
                logger.error(f"{claim.shard_id}: releasing the claim; this worker cannot run shards: {exc}")
                attempts.close_attempt(attempt, AttemptExit.WORKER_FAULT, error=attempts.error_text(exc))
                self.release(claim, ReleaseReason.WORKER_FAULT)
                if isinstance(exc, OSError):
                    raise storage_error(exc, claim.shard_id, places=(("job directory", self.layout.root),)) from exc
                raise
            if not heartbeater.held():
                # Failing after losing the lease is not evidence against the shard.
                self._abandon(attempt, claim, attempts.error_text(exc))
                return
            self._fail(attempt, claim, exc)
            return
        except BaseException as exc:
            # SIGTERM/SIGINT (WorkerInterrupted, KeyboardInterrupt) or SystemExit: hand the
            # shard back at once so another worker need not wait a TTL.
            signalled = isinstance(exc, WorkerInterrupted | KeyboardInterrupt)
            self._drop_ahead("interrupted", ReleaseReason.SIGNAL if signalled else ReleaseReason.UNRUN, wait_secs=0.0)
            attempts.close_attempt(attempt, AttemptExit.SIGNAL, error="interrupted")
            self.release(claim, ReleaseReason.SIGNAL)
            raise
        finally:
            heartbeater.stop()
            tracker.finish()
        # Publishing never waits for the claim-ahead helper; the Claimer is ours again once its claim is made
        # (with the summary it gives up at once when nothing is claimable).
        if self.ahead is not None:
            self.ahead.wait_claimed()
        if outcome.accepted and self.pace is not None:
            quarantined = outcome.result.errors.rows if outcome.result.errors is not None else 0
            held = HeldClaim(claim.shard_id, claim.generation, claim.attempt_id)
            self.pace.finished(self.clock() - began, outcome.result.rows, entry.rows, quarantined, shard=held)
        if outcome.accepted or outcome.winner is not None:
            self.claimer.learn_done(entry.shard_id)
        if outcome.accepted:
            self.summary.done += 1
            logger.info(f"{entry.shard_id}: done ({outcome.result.rows} rows) by attempt {claim.attempt_id}")
        else:
            self.summary.discarded += 1
        errors = outcome.result.errors
        exit_reason = AttemptExit.DONE if outcome.accepted else AttemptExit.DISCARDED
        attempts.close_attempt(
            attempt, exit_reason, rows=outcome.result.rows, quarantined=errors.rows if errors else None
        )
        self.release(claim, ReleaseReason.FINISHED)

    def _abandon(self, attempt: attempts.Attempt | None, claim: Claim, reason: str) -> None:
        self.summary.lost += 1
        logger.warning(f"{claim.shard_id}: abandoning attempt {claim.attempt_id}: {reason}")
        attempts.close_attempt(attempt, AttemptExit.LOST, error=reason)
        self.release(claim, ReleaseReason.ABANDONED)

    def _fence(self, heartbeater: leases.Heartbeater, claim: Claim) -> None:
        """Self-fencing before publication: never publish on a lease we may have lost."""
        if not heartbeater.check():
            raise LeaseLostError(heartbeater.lost_reason or "lease lost", where=f"shard {claim.shard_id}")
        if leases.newer_generation_exists(self.layout, claim):
            raise LeaseLostError(
                f"generation {claim.generation + 1} was claimed by another worker", where=f"shard {claim.shard_id}"
            )

    def _fail(self, attempt: attempts.Attempt | None, claim: Claim, exc: Exception) -> None:
        message, error_type = attempts.error_text(exc), type(exc).__name__
        self.summary.failed += 1
        logger.error(f"{claim.shard_id}: attempt {claim.attempt_id} failed: {error_type}: {message}")
        try:
            outcome = self.claimer.fail(
                claim, claim.shard_id, claim.generation, message, error_type, FailureReason.ERROR
            )
        finally:  # even if the job dir refuses the failure record, give the claim back
            attempts.close_attempt(attempt, AttemptExit.FAILED, error=message)
            self.release(claim, ReleaseReason.FAILED)
            self.claimer.cursor.position = self.claimer.index[claim.shard_id]  # the next walk retries it first
        if outcome.terminal is not None:
            logger.error(f"{claim.shard_id}: retry budget spent ({outcome.failures} failures)")

    def _give_up(self, claim: Claim, reason: str) -> None:
        """The attempt stalled (heartbeat thread): record it as a holder death and release the
        claim now, so another worker takes the shard without waiting a TTL."""
        logger.error(f"{claim.shard_id}: giving up attempt {claim.attempt_id}: {reason}")
        # before the runtime watch restarts (execs) this process: a claim in flight is released too
        self._drop_ahead(f"{claim.shard_id} stalled", wait_secs=self.heartbeat)
        try:
            self.claimer.fail(claim, claim.shard_id, claim.generation, reason, "ShardStalled", FailureReason.STALLED)
        finally:
            self.release(claim, ReleaseReason.STALLED)

    def release(self, claim: Claim, reason: ReleaseReason) -> None:
        leases.release_or_warn(self.layout, claim, reason)
        self.let_go(claim, reason)


def _every(n: int, call: Callable[[], object]) -> Callable[[], object]:
    """``call`` on every ``n``-th invocation, the first included."""
    counter = itertools.count()
    return lambda: call() if next(counter) % n == 0 else None


def empty_output(task: ShardTask) -> ShardOutput:
    """The output of a shard without rows (a unit larger than its share left it empty, ``shards.plan``):
    nothing to run, an empty file to publish."""
    fsio.write_new(task.output_path, b"")
    return ShardOutput(task.output_path, 0)
