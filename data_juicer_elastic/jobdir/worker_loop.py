"""The worker loop: claim shards in manifest order, run them, publish, release, repeat.

Every decision that matters for correctness is made by ``leases`` (who may
claim) and ``attempts`` (what is accepted); this module sequences them and makes
sure every way out of an attempt leaves a record: a result + release, a failure
+ release, or (on SIGTERM/SIGINT) a release, so no shard waits a TTL for nothing.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from loguru import logger

from data_juicer_elastic.errors import ConfigError, LeaseLostError, is_worker_fault, storage_error
from data_juicer_elastic.jobdir import attempts, claiming, confine, leases, liveness, progress
from data_juicer_elastic.jobdir.claim_ahead import RELEASE_SIGNAL, RELEASE_UNRUN, AheadShard, ClaimAhead
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import check_shard_file, check_shard_files, load_manifest
from data_juicer_elastic.jobdir.outcome import job_outcome
from data_juicer_elastic.jobdir.records import Claim, Manifest, ShardEntry, TerminalInfo
from data_juicer_elastic.jobdir.tasks import ShardOutput, ShardTask
from data_juicer_elastic.jobdir.worker_signals import SignalGuard, WorkerInterrupted, honour
from data_juicer_elastic.rows.codecs import SHARD_SUFFIX
from data_juicer_elastic.settings import check_values
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

RunShard = Callable[[ShardTask], ShardOutput]
# Claim ahead once the running shard is expected to be this far through: the next shard is then
# held for about a fifth of a shard's time, not a whole one, while another node may be idle.
TAIL_FRACTION: Final = 0.8


@dataclass
class WorkerSummary:
    claimed: int = 0  # claims this worker won (failed ones count)
    done: int = 0  # results of this worker that were accepted
    discarded: int = 0  # finished, but another attempt had published first
    failed: int = 0  # attempts of this worker that failed
    lost: int = 0  # attempts abandoned because the lease was lost
    terminal_failures: list[TerminalInfo] = field(default_factory=list)  # (shard_id, last_error), whole job
    complete: bool = False  # every shard of the job is done
    stop_reason: str = ""  # finished | max_shards | max_done | no_work | stopped | interrupted
    unrun: int = 0  # claimed ahead, then handed back without running (not attempts: counted nowhere else)


def run_worker(
    job_dir: str | Path,
    identity: WorkerIdentity,
    run_shard: RunShard,
    *,
    ttl_secs: float,
    heartbeat_secs: float,
    max_retries: int,
    poll_interval_secs: float,
    max_shards: int | None = None,
    wait_for_completion: bool = True,
    stop_event: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] | None = None,
    max_done: int | None = None,
    claim_gate: Callable[[], bool] | None = None,
    claim_rng: random.Random | None = None,
    on_attempt: Callable[[progress.ProgressTracker], None] | None = None,
    max_holder_deaths: int | None = None,
    before_claim: Callable[[], bool] | None = None,
    stall_timeout_secs: float | None = None,
    random_start: bool = False,
    claim_ahead: bool = True,
    read_ahead: Callable[[Path], object] | None = None,
) -> WorkerSummary:
    """Process shards of ``job_dir`` until the job is finished (or a limit is reached).

    ``max_done`` stops the worker once this many of its results were accepted (strict
    mode's share): unlike ``max_shards`` a failed attempt does not use it up.
    ``claim_gate()`` may decline claiming a pending shard for now (straggler
    avoidance); taking over a stale or dead claim is never declined.
    ``claim_rng`` picks where this worker jumps (and, with ``random_start``, where it starts
    looking, else at the first shard; ``claiming``); tests pass a seeded one.
    ``on_attempt(tracker)`` is called as each attempt starts with its live progress
    tracker (``jobdir.progress``), e.g. to drive a terminal progress bar.
    ``max_holder_deaths``: deaths of a shard's holders (killed, lease expired, stalled) that
    fail it, apart from ``max_retries`` (None: never).  ``before_claim()`` readies the runner
    before each claim (``claiming``).  ``stall_timeout_secs``: give a shard up when its attempt
    shows no sign of life for this long (``jobdir.liveness``; None: a heartbeat means alive).
    ``claim_ahead``: in a shard's tail, claim the next one (at most one) and check its input,
    with ``read_ahead(path)`` reading it (``jobdir.claim_ahead``); it is released unrun at once on
    every way out that does not run it.
    """
    check_values(  # the settings' own rules: a caller may pass plain values
        {
            "lease_ttl_secs": ttl_secs,
            "heartbeat_interval_secs": heartbeat_secs,
            "max_retries": max_retries,
            "poll_interval_secs": poll_interval_secs,
            "max_shards": max_shards,
        }
    )
    if max_done is not None and max_done < 1:
        raise ConfigError(f"invalid value {max_done!r}: must be >= 1 or null", where="max_done")
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)  # refuse a corrupt job before claiming anything
    confine.check_layout(layout)  # and one whose directories lead elsewhere
    check_shard_files(layout.root, manifest)
    observer = leases.StalenessObserver(ttl_secs, clock)
    summary = WorkerSummary()
    if sleep is None:
        sleep = stop_event.wait if stop_event is not None else time.sleep
    worker = _Worker(
        layout,
        manifest,
        identity,
        run_shard,
        observer,
        summary,
        ttl_secs,
        heartbeat_secs,
        max_retries,
        clock,
        claim_gate=claim_gate,
        rng=claim_rng,
        max_holder_deaths=max_holder_deaths,
        before_claim=before_claim,
        random_start=random_start,
    )
    worker.on_attempt, worker.stall_secs = on_attempt, stall_timeout_secs
    if claim_ahead:

        def may_claim_ahead() -> bool:
            """Only a shard that the limits would let this worker run next (``claimed`` counts the
            running one): none is claimed ahead to be handed back by a limit."""
            if stop_event is not None and stop_event.is_set():
                return False
            if max_shards is not None and summary.claimed >= max_shards:
                return False
            return max_done is None or summary.done + 1 < max_done

        worker.ahead = ClaimAhead(
            layout,
            manifest,
            worker.claim_next,
            heartbeat_secs=heartbeat_secs,
            ttl_secs=ttl_secs,
            clock=clock,
            read_ahead=read_ahead,
        )
        worker.may_claim_ahead = may_claim_ahead

    with SignalGuard() as guard:
        try:
            while True:
                if stop_event is not None and stop_event.is_set():
                    summary.stop_reason = "stopped"
                    break
                if max_shards is not None and summary.claimed >= max_shards:
                    summary.stop_reason = "max_shards"
                    break
                if max_done is not None and summary.done >= max_done:
                    summary.stop_reason = "max_done"
                    break
                # A shard claimed ahead while the last one ran comes first (its claim, check and
                # read are done); else claim one now.
                claimed, finished = worker.take_ahead(), False
                if claimed is None:
                    claimed, finished = worker.claim_next()
                if claimed is not None:
                    worker.run(*claimed)
                    worker.pending = None
                    continue
                if finished:
                    summary.stop_reason = "finished"
                    break
                if not wait_for_completion:
                    summary.stop_reason = "no_work"
                    break
                sleep(poll_interval_secs)
        except OSError as exc:
            # The job directory refused a write the loop cannot do without (claim, failure
            # record): stop with one clear error naming the path instead of a traceback.
            raise storage_error(exc, layout.root) from exc
        except WorkerInterrupted as interrupt:
            guard.restore()
            if worker.pending is not None:  # signalled between claiming and running: give it back
                worker._release(worker.pending, "signal")
            if worker.ahead is not None:  # and the shard claimed ahead, before the signal is honoured
                worker.ahead.close(RELEASE_SIGNAL, why="signal", wait_secs=heartbeat_secs)
            logger.warning(f"worker stopping on signal {interrupt.signum}")
            honour(interrupt.signum, guard.previous.get(interrupt.signum))
            summary.stop_reason = "interrupted"  # the previous handler chose not to exit
        finally:
            # Every other way out (a stop, a limit, an error): nothing stays claimed ahead.
            if worker.ahead is not None:
                worker.ahead.close(RELEASE_UNRUN, why=f"worker stopping: {summary.stop_reason or 'error'}")
                summary.unrun = worker.ahead.unrun
    summary.complete, summary.terminal_failures = job_outcome(layout, manifest, worker.claimer.known_done)
    return summary


class _Worker:
    def __init__(
        self, layout, manifest, identity, run_shard, observer, summary, ttl, heartbeat, max_retries, clock, **claim
    ):
        self.layout: JobLayout = layout
        self.manifest: Manifest = manifest
        self.identity: WorkerIdentity = identity
        self.run_shard: RunShard = run_shard
        self.observer: leases.StalenessObserver = observer
        self.summary: WorkerSummary = summary
        self.ttl, self.heartbeat, self.max_retries, self.clock = ttl, heartbeat, max_retries, clock
        self.on_attempt: Callable[[progress.ProgressTracker], None] | None = None
        self.stall_secs: float | None = None
        self.secs_per_row: float | None = None  # of this worker's last finished shard: when the next one's tail starts
        self.max_holder_deaths: int | None = claim.get("max_holder_deaths")
        self.claimer = claiming.Claimer(layout, manifest, identity, observer, max_retries=max_retries, **claim)
        self.ahead: ClaimAhead | None = None  # claim-ahead (jobdir.claim_ahead), when on
        self.may_claim_ahead: Callable[[], bool] = lambda: False

    @property
    def pending(self) -> Claim | None:
        """Claimed and not yet handed back (a signal must release it)."""
        return self.claimer.pending

    @pending.setter
    def pending(self, claim: Claim | None) -> None:
        self.claimer.pending = claim

    def claim_next(self) -> tuple[tuple[ShardEntry, Claim] | None, bool]:
        """(entry, claim) for a claimable shard we won, else (None, all shards finished)."""
        return self.claimer.claim_next()

    def in_tail(self, tracker: progress.ProgressTracker) -> bool:
        """The running shard is expected to be in its last part (``TAIL_FRACTION``): by the time
        per row of this worker's last shard; for its first, once its output rows reach that part
        of its input (a filter may keep them from it: then the next is claimed when it ends).
        Ray Data's rows read say nothing here: the runner reads a shard whole before processing."""
        record = tracker.current
        if self.secs_per_row is None:
            return record.rows_written >= TAIL_FRACTION * record.rows_total
        return record.elapsed_secs >= TAIL_FRACTION * self.secs_per_row * record.rows_total

    def take_ahead(self) -> tuple[ShardEntry, Claim, AheadShard] | None:
        """The shard claimed ahead while the last one ran, if any (and its lease still held)."""
        ahead = self.ahead.take() if self.ahead is not None else None
        if ahead is None:
            return None
        self.pending = ahead.claim  # from here a signal releases it as any claimed-but-not-run shard
        return ahead.entry, ahead.claim, ahead

    def _drop_ahead(self, why: str, reason: str = RELEASE_UNRUN, wait_secs: float | None = None) -> None:
        """The current shard did not finish: hand the shard claimed ahead back at once (another
        worker may take it; this one retries its own shard first, as before).  Waits
        ``wait_secs`` (None: until done) for a claim in flight, so the Claimer is free again."""
        if self.ahead is not None:
            self.ahead.release(reason, why=why, wait_secs=wait_secs)

    # -- running -------------------------------------------------------------------------------------
    def run(self, entry: ShardEntry, claim: Claim, ahead: AheadShard | None = None) -> None:
        """Run one claimed shard; every way out leaves a result, a failure or a release.

        ``ahead``: the shard was claimed ahead; its input file was checked then (not hashed
        again if unchanged).  While it runs, the next shard is claimed ahead (when on)."""
        self.summary.claimed += 1
        tracker = progress.ProgressTracker(self.layout, claim, entry.rows)
        if self.on_attempt is not None:
            self.on_attempt(tracker)  # e.g. a terminal progress bar for this shard
        alive = None if self.stall_secs is None else liveness.Liveness(self.stall_secs, self.clock)
        if alive is not None:  # every change of the live progress is a sign of life
            tracker.listeners.append(lambda record: alive.note(f"{record.stage}, {record.rows_written} rows out"))
            tracker.liveness = alive  # the runner finds it there (progress.current())
        heartbeater = leases.Heartbeater(
            self.layout,
            claim,
            heartbeat_secs=self.heartbeat,
            ttl_secs=self.ttl,
            clock=self.clock,
            on_beat=tracker.flush,
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
            task = ShardTask(
                shard_id=entry.shard_id,
                shard_path=self.layout.shard(entry.shard_id, SHARD_SUFFIX[self.manifest.shard_codec]),
                attempt_dir=attempt.dir,
                generation=claim.generation,
                attempt_id=claim.attempt_id,
                input_rows=entry.rows,
                input_sha256=entry.sha256,
                read_ahead=ahead.read if prechecked else None,
            )
            if not prechecked:
                check_shard_file(self.layout, self.manifest, entry)  # a link out of the job dir is never read
            if self.ahead is not None and self.may_claim_ahead():
                # the next shard's claim, check and read overlap this one's tail (see claim_ahead)
                self.ahead.start(in_tail=lambda: self.in_tail(tracker))
            with progress.activate(tracker), alive.armed() if alive else nullcontext():
                started = self.clock()
                output = self.run_shard(task)
                self.secs_per_row = (self.clock() - started) / max(entry.rows, 1)
            if self.ahead is not None:
                self.ahead.wait_claimed()  # the helper is done with the Claimer before we use it
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
                _close(attempt, "worker-fault", error=attempts.error_text(exc))
                self._release(claim, "worker-fault")
                if isinstance(exc, OSError):
                    raise storage_error(exc, claim.shard_id) from exc
                raise
            if not heartbeater.check() or leases.newer_generation_exists(self.layout, claim):
                # Failing after losing the lease is not evidence against the shard.
                self._abandon(attempt, claim, attempts.error_text(exc))
                return
            self._fail(attempt, claim, exc)
            return
        except BaseException as exc:
            # SIGTERM/SIGINT (WorkerInterrupted, KeyboardInterrupt) or SystemExit: hand the
            # shard back at once so another worker need not wait a TTL.
            signalled = isinstance(exc, WorkerInterrupted | KeyboardInterrupt)
            self._drop_ahead("interrupted", RELEASE_SIGNAL if signalled else RELEASE_UNRUN, wait_secs=0.0)
            _close(attempt, "signal", error="interrupted")
            self._release(claim, "signal")
            raise
        finally:
            heartbeater.stop()
            tracker.finish()
        if outcome.accepted or outcome.winner is not None:
            self.claimer.learn_done(entry.shard_id)
        if outcome.accepted:
            self.summary.done += 1
            logger.info(f"{entry.shard_id}: done ({outcome.result.rows} rows) by attempt {claim.attempt_id}")
        else:
            self.summary.discarded += 1
        _close(attempt, "done" if outcome.accepted else "discarded", rows=outcome.result.rows)
        self._release(claim, leases.RELEASE_FINISHED)

    def _abandon(self, attempt: attempts.Attempt | None, claim: Claim, reason: str) -> None:
        self.summary.lost += 1
        logger.warning(f"{claim.shard_id}: abandoning attempt {claim.attempt_id}: {reason}")
        _close(attempt, "lost", error=reason)
        self._release(claim, "abandoned")

    def _fence(self, heartbeater: leases.Heartbeater, claim: Claim) -> None:
        """Self-fencing before publication: never publish on a lease we may have lost."""
        if not heartbeater.check():
            raise LeaseLostError(heartbeater.lost_reason or "lease lost", where=f"shard {claim.shard_id}")
        if leases.newer_generation_exists(self.layout, claim):
            raise LeaseLostError(
                f"generation {claim.generation + 1} was claimed by another worker", where=f"shard {claim.shard_id}"
            )

    def _fail(self, attempt: attempts.Attempt | None, claim: Claim, exc: Exception) -> None:
        message = attempts.error_text(exc)
        self.summary.failed += 1
        logger.error(f"{claim.shard_id}: attempt {claim.attempt_id} failed: {type(exc).__name__}: {message}")
        try:
            outcome = attempts.record_failure(
                self.layout,
                claim,
                shard_id=claim.shard_id,
                generation=claim.generation,
                error=message,
                error_type=type(exc).__name__,
                exit_reason="error",
                max_retries=self.max_retries,
                reporter=self.identity,
                max_holder_deaths=self.max_holder_deaths,
            )
        finally:  # even if the job dir refuses the failure record, give the claim back
            _close(attempt, "failed", error=message)
            self._release(claim, "failed")
            self.claimer.cursor.revisit(self.claimer.index[claim.shard_id])  # retry it first, as before
        if outcome.terminal is not None:
            logger.error(f"{claim.shard_id}: retry budget spent ({outcome.failures} failures)")

    def _give_up(self, claim: Claim, reason: str) -> None:
        """The attempt stalled (heartbeat thread): record it as a holder death and release the
        claim now, so another worker takes the shard without waiting a TTL."""
        logger.error(f"{claim.shard_id}: giving up attempt {claim.attempt_id}: {reason}")
        # before the runtime watch restarts (execs) this process: a claim in flight is released too
        self._drop_ahead(f"{claim.shard_id} stalled", wait_secs=self.heartbeat)
        try:
            attempts.record_failure(
                self.layout, claim, shard_id=claim.shard_id, generation=claim.generation, error=reason,
                error_type="ShardStalled", exit_reason="stalled", max_retries=self.max_retries,
                reporter=self.identity, max_holder_deaths=self.max_holder_deaths,
            )  # fmt: skip
        finally:
            self._release(claim, "stalled")

    def _release(self, claim: Claim, reason: str) -> None:
        try:
            leases.release_claim(self.layout, claim, reason)
        except OSError as exc:  # the claim then goes stale after a TTL; nothing else is lost
            logger.warning(f"{claim.shard_id}: could not write release record: {exc}")


def _close(attempt: attempts.Attempt | None, exit_reason: str, **fields) -> None:
    if attempt is not None:
        attempts.close_attempt(attempt, exit_reason, **fields)
