"""Elections, phase results and the one final outcome of a run, each an exclusive ``link()``; a
leader renews ``<phase>.heartbeat.json`` and waiters judge it gone as they judge a shard lease
(docs/architecture.md, "Coordination protocol").  Every instance reports the one ``outcome.json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final, NoReturn

from loguru import logger

from data_juicer_elastic import errors
from data_juicer_elastic.coordination.run_id import RunId
from data_juicer_elastic.coordination.run_records import (
    FAILED,
    OK,
    Instance,
    Leader,
    Outcome,
    Participant,
    ParticipantExit,
    PhaseHeartbeat,
    PrepareResult,
    RunPhase,
    RunRecord,
)
from data_juicer_elastic.errors import CoordinatorLostError, ElasticError, JobDirError
from data_juicer_elastic.jobdir import confine
from data_juicer_elastic.jobdir.heartbeats import Clock, RenewThread, Sighting, StalenessObserver
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.task_queue import process_gone_here
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

MAX_MESSAGE_CHARS: Final = 4000


def error_from_outcome(outcome: Outcome) -> ElasticError:
    """The error a failed outcome describes, as the same class when it is one of ours."""
    cls = getattr(errors, outcome.error_type or "", None)
    if not (isinstance(cls, type) and issubclass(cls, ElasticError)):
        cls = ElasticError
    return cls(outcome.message or "the run was aborted", where=outcome.where, hint=outcome.hint)


class RunCoordinator:
    """One instance's view of its run's coordination directory."""

    def __init__(
        self,
        layout: JobLayout,
        run: RunId,
        identity: WorkerIdentity,
        *,
        ttl_secs: float,
        heartbeat_secs: float,
        poll_secs: float,
        clock: Clock = time.monotonic,
    ):
        self.layout, self.run, self.identity = layout, run, identity
        self.instance = Instance.of(identity, identity.new_attempt_id())
        self.ttl_secs, self.heartbeat_secs, self.poll_secs = ttl_secs, heartbeat_secs, poll_secs
        self.clock, self.sleep = clock, time.sleep  # tests replace sleep to drive the wait
        self.key = run.key
        self.dir = layout.run_dir(self.key)
        self.joined_at: float | None = None

    @property
    def instance_id(self) -> str:
        return self.instance.instance_id

    def join(self, slots: int = 1) -> None:
        """Create the run directory, check it is ours, and register this instance."""
        confine.ensure_dir(self.layout, self.layout.participants_dir(self.key))
        record = RunRecord(self.run.value, self.run.source, time.time(), self.instance_id)
        if not fsio.publish_bytes(self.layout.run_record(self.key), record.encode()):
            existing = RunRecord.read(self.layout.run_record(self.key))
            if existing is not None and existing.run_id != self.run.value:  # a hash collision, or tampering
                raise JobDirError(
                    f"coordination directory {self.dir.name} belongs to run {existing.run_id!r}, "
                    f"not {self.run.value!r}",
                    where=str(self.dir),
                    hint="set a different elastic.run_id",
                )
        self.joined_at = time.time()
        self._write_participant(slots)

    def leave(self, exit_reason: ParticipantExit, slots: int = 1, shards_done: int | None = None) -> None:
        """Record how this instance ended (informational; a write error is only logged)."""
        try:
            self._write_participant(slots, left_at=time.time(), exit_reason=exit_reason, shards_done=shards_done)
        except OSError as exc:
            logger.warning(f"could not record the end of instance {self.instance_id}: {exc}")

    def _write_participant(self, slots: int, **ended: Any) -> None:
        record = Participant(self.run.value, self.instance, slots, self.joined_at or time.time(), **ended)
        fsio.atomic_write(self.layout.participant(self.key, self.instance_id), record.encode())

    def participants(self) -> list[Participant]:
        found = []
        directory = self.layout.participants_dir(self.key)
        for name in fsio.list_names(directory):
            if name.startswith(".") or not name.endswith(".json"):
                continue
            try:
                found.append(Participant.read(directory / name))
            except JobDirError as exc:
                logger.warning(f"ignoring corrupt participant record: {exc}")
        return sorted((p for p in found if p is not None), key=lambda p: p.joined_at)

    def elect(self, phase: RunPhase) -> tuple[bool, Leader]:
        """(we won, the leader): exactly one instance of the run wins each phase."""
        record = Leader(self.run.value, phase, self.instance, time.time())
        path = self.layout.leader(self.key, phase)
        if fsio.publish_bytes(path, record.encode()):
            logger.info(f"elected as {phase} coordinator of run {self.run.value}")
            return True, record
        leader = self.leader(phase)
        if leader is None:  # unreadable: no instance can act on it, so nobody will publish a result
            raise JobDirError(f"the {phase} leader record is unreadable", where=str(path), hint="re-submit the job")
        return leader.instance.instance_id == self.instance_id, leader

    def leader(self, phase: RunPhase) -> Leader | None:
        return Leader.read(self.layout.leader(self.key, phase))

    def publish_prepare_result(self, result: PrepareResult) -> PrepareResult:
        path = self.layout.prepare_result(self.key)
        if fsio.publish_bytes(path, result.encode()):
            return result
        return self.prepare_result() or result

    def prepare_result(self) -> PrepareResult | None:
        return PrepareResult.read(self.layout.prepare_result(self.key))

    def outcome(self) -> Outcome | None:
        return Outcome.read(self.layout.outcome(self.key))

    def publish_outcome(self, outcome: Outcome) -> Outcome:
        """Publish the run's ending unless one exists; the outcome in effect either way."""
        confine.ensure_dir(self.layout, self.dir)
        if fsio.publish_bytes(self.layout.outcome(self.key), outcome.encode()):
            verb = "finalized" if outcome.ok else f"aborted ({outcome.phase}): {outcome.error_type}: {outcome.message}"
            logger.info(f"run {self.run.value} {verb}")
            return outcome
        existing = self.outcome()
        if existing is None:
            raise JobDirError("the run's outcome record is unreadable", where=str(self.layout.outcome(self.key)))
        return existing

    def finalized(self, details: dict[str, Any]) -> Outcome:
        return self.publish_outcome(
            Outcome(self.run.value, OK, "finalize", self.instance, time.time(), details=details)
        )

    def abort(self, phase: RunPhase, error: BaseException) -> Outcome:
        """Publish ``error`` as the run's failed outcome (first abort wins); the outcome in effect."""
        if isinstance(error, ElasticError):
            fields = dict(error_type=type(error).__name__, message=error.message, where=error.where, hint=error.hint)
        else:  # an unexpected error: keep its type in the message, report it as ours
            fields = dict(error_type="ElasticError", message=f"{type(error).__name__}: {error}", where=phase, hint=None)
        fields["message"] = (fields["message"] or "")[-MAX_MESSAGE_CHARS:]
        try:
            return self.publish_outcome(Outcome(self.run.value, FAILED, phase, self.instance, time.time(), **fields))
        except OSError as exc:
            # The job directory refuses even this record (a full disk that also failed the phase):
            # this instance reports the phase's own error; the others see its leader heartbeat stop.
            logger.warning(f"could not record the end of run {self.run.value}: {exc}")
            if isinstance(error, ElasticError):
                raise error from None
            root = self.layout.root
            raise errors.storage_error(exc, root, "run the job again", (("job directory", root),)) from None

    def raise_if_aborted(self) -> None:
        outcome = self.outcome()
        if outcome is not None and not outcome.ok:
            raise_outcome(outcome)

    def await_phase(self, phase: RunPhase, leader: Leader, done: Callable[[], Any]) -> Any:
        """Poll ``done()`` until it returns a value; raise the run's abort, or abort when the leader is gone."""
        watch = LeaderWatch(self, phase, leader)
        logger.info(f"waiting for the {phase} coordinator {leader.instance.describe()}")
        while True:
            value = done()
            if value is not None:
                return value
            self.raise_if_aborted()
            lost = watch.lost_reason()
            if lost is not None:
                raise_outcome(
                    self.abort(
                        phase,
                        CoordinatorLostError(
                            f"the {phase} coordinator {leader.instance.describe()} {lost} before publishing a result",
                            where=f"run {self.run.value}",
                            hint="re-submit the job (a new submission gets a new coordination generation and "
                            "reuses every finished shard)",
                        ),
                    )
                )
            self.sleep(self.poll_secs)


def raise_outcome(outcome: Outcome) -> NoReturn:
    raise error_from_outcome(outcome)


class LeaderWatch:
    """Is a phase leader still alive?  Judged like a shard lease: by heartbeat change on our clock."""

    def __init__(self, coordinator: RunCoordinator, phase: RunPhase, leader: Leader):
        self.c, self.phase, self.leader = coordinator, phase, leader
        self._observer = StalenessObserver(coordinator.ttl_secs, coordinator.clock)

    def lost_reason(self) -> str | None:
        c = self.c
        if process_gone_here(c.identity, self.leader.instance):
            return "exited"
        try:
            beat = PhaseHeartbeat.read(c.layout.phase_heartbeat(c.key, self.phase))
            token = (beat.instance_id, beat.seq) if beat is not None else None
        except JobDirError as exc:  # torn or foreign: counts as "no change", like a lease heartbeat
            token = ("error", str(exc))
        if self._observer.is_stale(Sighting(self.phase, token)):
            return f"stopped renewing its heartbeat for {c.ttl_secs:g}s (killed, lost or hung)"
        return None


class PhaseHeartbeater:
    """Renews ``<phase>.heartbeat.json`` from a daemon thread while the leader works."""

    def __init__(self, coordinator: RunCoordinator, phase: RunPhase):
        self.c, self.phase = coordinator, phase
        self.seq = 0
        self._renewer = RenewThread(coordinator.heartbeat_secs, self.beat, f"{phase}-heartbeat")

    def beat(self) -> bool:
        """One renewal; always True: a failed write is only logged (waiters may then call us lost
        after a TTL, the safe direction), and the leader keeps trying."""
        self.seq += 1
        record = PhaseHeartbeat(self.c.run.value, self.phase, self.c.instance_id, self.seq, time.time())
        try:
            fsio.atomic_write(self.c.layout.phase_heartbeat(self.c.key, self.phase), record.encode(), durable=False)
        except OSError as exc:
            logger.warning(f"{self.phase} heartbeat failed: {exc}")
        return True

    def __enter__(self) -> PhaseHeartbeater:
        self._renewer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._renewer.stop()
