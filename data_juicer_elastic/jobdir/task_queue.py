"""The task queue: the tasks of one namespace of the job directory (a ``JobLayout``: the shards, their
scans under ``scans/``, the job summary's writer under ``summary/``), claimed, renewed, released, failed
and published by one lease protocol (docs/leases-on-nfs.md, "The lease protocol built on them";
budgets: docs/failure-semantics.md), and one attempt's every way out recorded (:meth:`TaskQueue.attempt`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import TracebackType

from loguru import logger

from data_juicer_elastic.errors import LeaseLostError, storage_error
from data_juicer_elastic.jobdir.attempts import MAX_ERROR_CHARS, Attempt, close_attempt, error_text, open_attempt
from data_juicer_elastic.jobdir.heartbeats import (
    Heartbeater,
    StalenessObserver,
    newer_generation_exists,
    read_heartbeat,
    token_text,
)
from data_juicer_elastic.jobdir.job_summary import PaceWriter
from data_juicer_elastic.jobdir.layout import JobLayout, ensure_dir, parse_gen_name
from data_juicer_elastic.jobdir.records import (
    DEATH_REASONS,
    AttemptExit,
    Claim,
    Failure,
    FailureReason,
    Heartbeat,
    Release,
    ReleaseReason,
    TakeoverReason,
    TerminalFailure,
)
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity, pid_alive


@dataclass(frozen=True)
class LeaseView:
    """What one read of a shard's lease files showed."""

    shard_id: str
    generation: int  # latest claim generation, 0 when never claimed
    claim: Claim | None  # None when missing or corrupt
    claim_error: str | None
    release: Release | None
    failure: Failure | None
    heartbeat: Heartbeat | None
    heartbeat_error: str | None

    @property
    def ended(self) -> bool:
        """The holder of the latest generation gave it up (release or failure record)."""
        return self.release is not None or self.failure is not None

    @property
    def watch_key(self) -> str:
        return self.shard_id

    @property
    def watch_token(self) -> str:
        """What a staleness observer watches (the generation and its heartbeat), as the job summary
        records the value its writer watched."""
        return token_text(self.generation, self.heartbeat, self.heartbeat_error)


def latest_generation(layout: JobLayout, shard_id: str) -> int:
    """Highest claim generation of a shard.  The listing is a hint (cached on NFS); names
    above it are probed by opening them, and a missed one only costs a failed link later."""
    gens = [g for g in map(parse_gen_name, fsio.list_names(layout.claim_dir(shard_id))) if g is not None]
    generation = max(gens, default=0)
    while fsio.exists(layout.claim(shard_id, generation + 1)):
        generation += 1
    return generation


def read_lease(layout: JobLayout, shard_id: str) -> LeaseView:
    generation = latest_generation(layout, shard_id)
    if generation == 0:
        return LeaseView(shard_id, 0, None, None, None, None, None, None)
    claim, claim_error = Claim.read_or_error(layout.claim(shard_id, generation))
    if claim is not None and (claim.shard_id, claim.generation) != (shard_id, generation):
        claim, claim_error = None, f"claim file names {claim.shard_id} gen {claim.generation}"
    release, _ = Release.read_or_error(layout.release(shard_id, generation))
    failure, _ = Failure.read_or_error(layout.failure(shard_id, generation))
    heartbeat, hb_error = read_heartbeat(layout, shard_id, generation)
    return LeaseView(shard_id, generation, claim, claim_error, release, failure, heartbeat, hb_error)


def holder_dead_here(view: LeaseView, identity: WorkerIdentity) -> bool:
    """The claim was made in our kernel and pid namespace and its pid is gone: dead for sure."""
    return view.claim is not None and process_gone_here(identity, view.claim)


def process_gone_here(identity: WorkerIdentity, process) -> bool:
    """``process`` (a record with hostname, boot_id, pid_namespace and pid: a claim, a pace
    record) ran in our kernel and pid namespace, is not us, and its pid is gone."""
    if process.pid == identity.pid:
        return False
    if not identity.same_kernel_namespace(process.hostname, process.boot_id, process.pid_namespace):
        return False
    return not pid_alive(process.pid)


def takeover_reason(
    view: LeaseView, identity: WorkerIdentity, observer: StalenessObserver, vouched_stale: str | None = None
) -> TakeoverReason | None:
    """Why the latest generation may be claimed over, or None while it is held.  Always feeds the
    observer, so its memory of each value is as old as possible.  ``vouched_stale``: the heartbeat
    value the job summary's writer watched unchanged for a TTL (stale for us too if we read it now)."""
    if view.generation == 0:
        return TakeoverReason.FIRST
    stale = observer.is_stale(view) or (vouched_stale is not None and vouched_stale == view.watch_token)
    if view.release is not None:
        if view.release.reason == ReleaseReason.FINISHED and not stale:
            # The done marker exists, even if a lagging cache (NFS negative lookups, up to
            # acdirmax) does not show it to us yet: taking over now would re-run a finished
            # shard.  After a TTL unchanged on our clock (TTL >= 3x cache time) the marker is
            # visible; if it really is gone, the shard is run again then.
            return None
        return TakeoverReason.RELEASED
    if view.failure is not None:
        return TakeoverReason.FAILED
    if holder_dead_here(view, identity):
        return TakeoverReason.HOLDER_DEAD
    return TakeoverReason.STALE if stale else None


def publish_claim(
    layout: JobLayout,
    view: LeaseView,
    identity: WorkerIdentity,
    attempt_id: str,
    reason: TakeoverReason,
) -> Claim | None:
    """Try to publish generation ``view.generation + 1``; the Claim if we won, None if not."""
    claim = Claim(
        shard_id=view.shard_id,
        generation=view.generation + 1,
        attempt_id=attempt_id,
        **asdict(identity),  # the claimer's whole identity: node, host, boot, pid namespace, pid
        claimed_at=time.time(),
        takeover_of=view.generation,
        takeover_reason=reason,
    )
    path = layout.claim(view.shard_id, claim.generation)
    ensure_dir(layout, path.parent)
    if not fsio.publish_bytes(path, claim.encode()):
        return None  # another taker won this generation
    return claim


def release_claim(layout: JobLayout, claim: Claim, reason: ReleaseReason) -> bool:
    """Give up our generation so others may take over at once.  Idempotent: True when a
    release of our attempt is (now) recorded."""
    record = Release(claim.shard_id, claim.generation, claim.attempt_id, reason, time.time())
    path = layout.release(claim.shard_id, claim.generation)
    ensure_dir(layout, path.parent)
    if fsio.publish_bytes(path, record.encode()):
        return True
    existing, _ = Release.read_or_error(path)  # released before (e.g. by the signal path): still ours
    return existing is not None and existing.attempt_id == claim.attempt_id


def split_failures(failures: list[Failure]) -> tuple[list[Failure], list[Failure]]:
    """(execution failures, holder deaths) of a shard, each in generation order."""
    deaths = [f for f in failures if f.exit_reason in DEATH_REASONS]
    return [f for f in failures if f.exit_reason not in DEATH_REASONS], deaths


@dataclass(frozen=True)
class FailureOutcome:
    recorded: bool  # False: a failure for this generation was already recorded
    failures: int  # valid failure records of the shard now
    terminal: TerminalFailure | None  # set when the retry budget is spent


def record_failure(
    layout: JobLayout,
    claim: Claim | None,
    *,
    shard_id: str,
    generation: int,
    error: str,
    error_type: str,
    exit_reason: FailureReason,
    max_retries: int,
    reporter: WorkerIdentity,
    max_holder_deaths: int | None = None,
) -> FailureOutcome:
    """Record that generation ``generation`` failed; publish failed/<shard>.json when the
    shard's execution has failed ``max_retries + 1`` times, or its holder died
    ``max_holder_deaths + 1`` times (None: deaths never fail it).  ``claim`` is the failed
    claim when known (None when its record is corrupt)."""
    record = Failure(
        shard_id=shard_id,
        generation=generation,
        attempt_id=claim.attempt_id if claim else "unknown",
        node_id=claim.node_id if claim else reporter.node_id,
        hostname=claim.hostname if claim else reporter.hostname,
        pid=claim.pid if claim else 0,
        error=error[-MAX_ERROR_CHARS:],
        error_type=error_type,
        exit_reason=exit_reason,
        failed_at=time.time(),
    )
    path = layout.failure(shard_id, generation)
    ensure_dir(layout, path.parent)
    recorded = fsio.publish_bytes(path, record.encode())
    failures = list_failures(layout, shard_id)
    terminal = publish_terminal_if_exhausted(layout, shard_id, max_retries, failures, max_holder_deaths)
    return FailureOutcome(recorded, len(failures), terminal)


def list_failures(layout: JobLayout, shard_id: str) -> list[Failure]:
    """Valid failure records of a shard in generation order (corrupt ones do not count)."""
    out = []
    directory = layout.failure_dir(shard_id)
    for name in fsio.list_names(directory):
        if parse_gen_name(name) is None:
            continue
        failure, error = Failure.read_or_error(directory / name)
        if error is not None:
            logger.warning(f"ignoring corrupt failure record: {error}")
        elif failure is not None:
            out.append(failure)
    return sorted(out, key=lambda f: f.generation)


def read_terminal(layout: JobLayout, shard_id: str) -> tuple[TerminalFailure | None, str | None]:
    return TerminalFailure.read_or_error(layout.failed(shard_id))


def publish_terminal_if_exhausted(
    layout: JobLayout,
    shard_id: str,
    max_retries: int,
    failures: list[Failure] | None = None,
    max_holder_deaths: int | None = None,
) -> TerminalFailure | None:
    """The shard's terminal failure if a budget is spent (publishing it if needed): more than
    ``max_retries`` execution failures, or more than ``max_holder_deaths`` holder deaths."""
    existing, _ = read_terminal(layout, shard_id)
    if existing is not None:
        return existing
    failures = list_failures(layout, shard_id) if failures is None else failures
    errors, deaths = split_failures(failures)
    if len(errors) > max_retries:
        last = errors[-1]
    elif max_holder_deaths is not None and len(deaths) > max_holder_deaths:
        last = deaths[-1]
    else:
        return None
    terminal = TerminalFailure(
        shard_id=shard_id,
        failures=len(failures),
        max_retries=max_retries,
        last_error=last.error,
        last_attempt_id=last.attempt_id,
        generations=[f.generation for f in failures],
        failed_at=time.time(),
        max_holder_deaths=max_holder_deaths,
    )
    ensure_dir(layout, layout.failed_dir)
    if fsio.publish_bytes(layout.failed(shard_id), terminal.encode()):
        logger.error(
            f"{shard_id}: {len(errors)} failed attempt(s) and {len(deaths)} holder death(s), giving up: {last.error}"
        )
        return terminal
    existing, _ = read_terminal(layout, shard_id)
    return existing or terminal


class TaskQueue:
    """One process's hold on one namespace of tasks: the lease protocol's every step, with the
    namespace's budgets (``max_retries``, ``max_holder_deaths``) and its observer of heartbeats."""

    def __init__(
        self,
        layout: JobLayout,
        identity: WorkerIdentity,
        *,
        ttl_secs: float,
        heartbeat_secs: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_retries: int = 0,
        max_holder_deaths: int | None = None,
        pace: PaceWriter | None = None,
    ):
        self.layout, self.identity = layout, identity
        self.ttl_secs, self.clock = ttl_secs, clock
        self.heartbeat_secs = ttl_secs / 4 if heartbeat_secs is None else heartbeat_secs
        self.max_retries, self.max_holder_deaths = max_retries, max_holder_deaths
        self.observer = StalenessObserver(ttl_secs, clock)
        # this process's pace record (jobdir.job_summary): the job summary's writer learns our claims from it
        self.pace = pace
        self.pending: Claim | None = None  # published, its attempt not yet over: a signal must release it

    def take(self, task_id: str, holder_id: str | None = None, *, take_over: bool = True) -> Claim | None:
        """Claim a task that is free or (``take_over``) whose holder is gone: the one task of a role's
        namespace (the summary's writer, a run's prepare and finalize).  None while it is held, or when
        another taker won.  ``holder_id``: the attempt id the claim records (a new one by default)."""
        view = read_lease(self.layout, task_id)
        reason = self.takeover_reason(task_id, view)
        if reason is None or (not take_over and reason is not TakeoverReason.FIRST):
            return None
        return publish_claim(self.layout, view, self.identity, holder_id or self.identity.new_attempt_id(), reason)

    def takeover_reason(self, task_id: str, view: LeaseView | None = None) -> TakeoverReason | None:
        """Why ``task_id`` may be claimed (or its holder is gone), None while it is held."""
        view = read_lease(self.layout, task_id) if view is None else view
        return takeover_reason(view, self.identity, self.observer)

    def holding(self, claim: Claim) -> None:
        """A claim handed to this process's work: the pace record lists it (written at once)."""
        if self.pace is not None:
            self.pace.holding(claim.shard_id, claim.generation, claim.attempt_id)
            self.pace.flush()

    def heartbeater(self, claim: Claim, **renewal) -> Heartbeater:
        """The claim's renewal (not started); ``renewal``: ``on_beat``, ``liveness``, ``on_stall``."""
        return Heartbeater(
            self.layout, claim, heartbeat_secs=self.heartbeat_secs, ttl_secs=self.ttl_secs, clock=self.clock, **renewal
        )

    def release(self, claim: Claim, reason: ReleaseReason, what: str = "") -> None:
        """Give the claim back (a write error logged: it then goes stale after a TTL).  The pace record
        stops listing it, written at once unless the task is finished (its done marker tells the summary)."""
        try:
            release_claim(self.layout, claim, reason)
        except OSError as exc:
            logger.warning(f"{what or claim.shard_id}: could not write the release record ({reason}): {exc}")
        if self.pace is not None:
            self.pace.let_go(claim.shard_id, claim.generation)
            if reason is not ReleaseReason.FINISHED:
                self.pace.flush()

    def release_pending(self, reason: ReleaseReason = ReleaseReason.SIGNAL) -> None:
        """Signalled between claiming a task and starting its attempt: give it back."""
        if self.pending is not None:
            self.release(self.pending, reason)
            self.pending = None

    def fail(
        self, holder: Claim | None, task_id: str, generation: int, error: str, error_type: str, reason: FailureReason
    ) -> FailureOutcome:
        """Record a generation's failure against the task's budgets (:func:`record_failure`)."""
        return record_failure(
            self.layout, holder, shard_id=task_id, generation=generation, error=error, error_type=error_type,
            exit_reason=reason, max_retries=self.max_retries, reporter=self.identity,
            max_holder_deaths=self.max_holder_deaths,
        )  # fmt: skip

    def record_takeover(self, view: LeaseView, reason: TakeoverReason) -> FailureOutcome:
        """A holder that vanished without a record is a death, with its own budget (docs/failure-semantics.md)."""
        holder = view.claim
        what = f"{holder.node_id} ({holder.hostname} pid {holder.pid})" if holder else "unknown holder"
        if reason == TakeoverReason.STALE:
            error = f"lease expired: {what} stopped renewing its claim (killed, lost or hung)"
            return self.fail(holder, view.shard_id, view.generation, error, "LeaseExpired", FailureReason.LEASE_EXPIRED)
        error = f"holder {what} died on this host without releasing its claim"
        return self.fail(holder, view.shard_id, view.generation, error, "LeaseExpired", FailureReason.HOLDER_DEAD)

    def attempt(
        self,
        claim: Claim,
        heartbeater: Heartbeater,
        what: str,
        *,
        worker_fault: Callable[[BaseException], bool] = lambda exc: False,
        on_exit: Callable[[AttemptScope, BaseException | None], object] | None = None,
    ) -> AttemptScope:
        """The attempt of a claimed task as a ``with`` block (``what``: the task in log lines)."""
        return AttemptScope(self, claim, heartbeater, what, worker_fault, on_exit)


class AttemptScope:
    """One attempt, from its claim to its last record.  The body opens the attempt (:meth:`open`), runs
    it, fences (:meth:`fence`), publishes and says so (:meth:`ended`).  Every way out leaves a record:
    a result, then a release; a lost lease (or an error after it): the attempt abandoned and released;
    an error: a failure record against the budgets, then a release; a fault of this worker
    (``worker_fault``): released without spending the budget, and raised; a signal or an exit: released
    at once (another worker need not wait a TTL), and raised.  ``on_exit(scope, exc)`` runs first, once
    ``scope.exit`` says how it ended; the heartbeat stops before any record."""

    def __init__(self, queue, claim, heartbeater, what, worker_fault, on_exit):
        self.queue: TaskQueue = queue
        self.claim: Claim = claim
        self.heartbeater: Heartbeater = heartbeater
        self.what, self.worker_fault, self.on_exit = what, worker_fault, on_exit
        self.attempt: Attempt | None = None
        self.exit = AttemptExit.LOST
        self.result: object = None  # what the body published (for on_exit)
        self.end: dict[str, int | str | None] = {}  # attempt.json's end fields (rows, quarantined)

    def __enter__(self) -> AttemptScope:
        return self

    def open(self) -> Attempt:
        self.attempt = open_attempt(self.queue.layout, self.claim, self.queue.identity)
        return self.attempt

    def fence(self) -> None:
        """Self-fencing before publication: never publish on a lease we may have lost."""
        if not self.heartbeater.check():
            raise LeaseLostError(self.heartbeater.lost_reason or "lease lost", where=self.what)
        if newer_generation_exists(self.queue.layout, self.claim):
            raise LeaseLostError(
                f"generation {self.claim.generation + 1} was claimed by another worker", where=self.what
            )

    def ended(self, accepted: bool, result: object = None, **end: int | str | None) -> None:
        self.exit, self.result, self.end = AttemptExit.DONE if accepted else AttemptExit.DISCARDED, result, end

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        self.heartbeater.stop()
        claim = self.claim
        if exc is None:
            self._notify(None)
            self._record(ReleaseReason.FINISHED, **self.end)
            return False
        if not isinstance(exc, Exception):  # SIGTERM/SIGINT (WorkerInterrupted, KeyboardInterrupt) or SystemExit
            self.exit = AttemptExit.SIGNAL
            self._notify(exc)
            self._record(ReleaseReason.SIGNAL, error="interrupted")
            return False
        message = exc.message if isinstance(exc, LeaseLostError) else error_text(exc)
        if self.worker_fault(exc):
            # This worker's set-up is wrong (different code, no Ray): the task is not to blame, so
            # hand it back without spending its retry budget.
            logger.error(f"{self.what}: releasing the claim; this worker cannot run shards: {exc}")
            self.exit = AttemptExit.WORKER_FAULT
            self._notify(exc)
            self._record(ReleaseReason.WORKER_FAULT, error=message)
            if isinstance(exc, OSError):
                raise storage_error(exc, claim.shard_id, places=(("job directory", self.queue.layout.root),)) from exc
            return False
        if isinstance(exc, LeaseLostError) or not self.heartbeater.held():
            # failing after losing the lease is not evidence against the task
            self._notify(exc)
            logger.warning(f"{self.what}: abandoning attempt {claim.attempt_id}: {message}")
            self._record(ReleaseReason.ABANDONED, error=message)
            return True
        self.exit = AttemptExit.FAILED
        self._notify(exc)
        error_type = type(exc).__name__
        logger.error(f"{self.what}: attempt {claim.attempt_id} failed: {error_type}: {message}")
        try:
            outcome = self.queue.fail(claim, claim.shard_id, claim.generation, message, error_type, FailureReason.ERROR)
        finally:  # even if the job dir refuses the failure record, give the claim back
            self._record(ReleaseReason.FAILED, error=message)
        if outcome.terminal is not None:
            logger.error(f"{self.what}: retry budget spent ({outcome.failures} failures)")
        return True

    def _notify(self, exc: BaseException | None) -> None:
        if self.on_exit is not None:
            self.on_exit(self, exc)

    def _record(self, reason: ReleaseReason, **end: int | str | None) -> None:
        close_attempt(self.attempt, self.exit, **end)
        self.queue.release(self.claim, reason, self.what)
