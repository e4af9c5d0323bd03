"""A run (one submission of the job): its id, its records under ``<job_dir>/coordination/<run-key>/``,
and one instance's view of it, :class:`RunCoordinator` (docs/architecture.md, "Coordination protocol").
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final, NoReturn

from loguru import logger

from data_juicer_elastic import errors
from data_juicer_elastic.errors import CoordinatorLostError, ElasticError, JobDirError
from data_juicer_elastic.jobdir.heartbeats import Clock
from data_juicer_elastic.jobdir.layout import JobLayout, ensure_dir
from data_juicer_elastic.jobdir.records import Claim, R, Record, ReleaseReason, TakeoverReason
from data_juicer_elastic.jobdir.roles import Role, read_holder
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

RUN_ID_ENV: Final = "DJ_ELASTIC_RUN_ID"
SCHEDULER_ENVS: Final = ("PAI_JOB_ID", "DLC_JOB_ID", "JOB_ID")
SLURM_JOB: Final = "SLURM_JOB_ID"
SLURM_STEP: Final = "SLURM_STEP_ID"
# Kubernetes puts no job identity in the environment; the launch recipe mounts the
# pod's labels with the downward API, and the Job controller labels every pod with
# the Job's uid (unique per submission, unlike the Job's name).
K8S_LABELS_FILE: Final = Path("/etc/podinfo/labels")
_K8S_UID_LABELS: Final = ("batch.kubernetes.io/controller-uid", "controller-uid")
DERIVED: Final = "derived"
RUN_KEY_CHARS: Final = 24


@dataclass(frozen=True)
class RunId:
    value: str
    source: str  # the setting or variable it came from, or "derived"

    @property
    def key(self) -> str:
        return run_key(self.value)

    @property
    def shared(self) -> bool:
        """False for a derived id: no other instance can know it."""
        return self.source != DERIVED


def run_key(run_id: str) -> str:
    """Directory name of a run: a hash, so any run id (slashes, spaces) is a safe path component."""
    return hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:RUN_KEY_CHARS]


def resolve_run_id(
    configured: str | None,
    environ: Mapping[str, str] | None = None,
    labels_file: Path = K8S_LABELS_FILE,
) -> RunId:
    """This instance's run id, found in the order docs/multinode.md gives ("The run id")."""
    env = os.environ if environ is None else environ
    if configured:
        return RunId(configured.strip(), "elastic.run_id")
    for name in (RUN_ID_ENV, *SCHEDULER_ENVS):
        value = env.get(name, "").strip()
        if value:
            return RunId(value if name == RUN_ID_ENV else f"{name}={value}", name)
    slurm = env.get(SLURM_JOB, "").strip()
    if slurm:
        step = env.get(SLURM_STEP, "").strip()
        return RunId(f"slurm-{slurm}" + (f".{step}" if step else ""), SLURM_JOB)
    k8s = kubernetes_job_uid(labels_file)
    if k8s:
        return RunId(f"k8s-job-{k8s}", str(labels_file))
    return RunId(f"{DERIVED}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(6)}", DERIVED)


_LABEL_LINE: Final = re.compile(r'^\s*([\w./\-]+)\s*=\s*"(.*)"\s*$')


def kubernetes_job_uid(labels_file: Path = K8S_LABELS_FILE) -> str | None:
    """The Job uid from a downward-API labels file (``key="value"`` lines), if mounted."""
    try:
        text = Path(labels_file).read_text(encoding="utf-8")
    except OSError:
        return None
    labels = dict(match.groups() for line in text.splitlines() if (match := _LABEL_LINE.match(line)))
    return next((labels[name] for name in _K8S_UID_LABELS if labels.get(name)), None)


class RunPhase(enum.StrEnum):
    """A phase of a run: the roles (prepare, finalize) and the work between them."""

    PREPARE = "prepare"
    WORK = "work"  # the phase an abort can also come from (terminal shard failure, strict timeout)
    FINALIZE = "finalize"


class OutcomeStatus(enum.StrEnum):
    """How a run ended (``Outcome.status``)."""

    OK = "ok"  # finalized
    FAILED = "failed"  # aborted


class ParticipantExit(enum.StrEnum):
    """How an instance left its run (``Participant.exit_reason``)."""

    FINALIZED = "finalized"
    ABORTED = "aborted"
    ERROR = "error"
    MAX_SHARDS = "max_shards"


# Short names callers use.
PREPARE, WORK, FINALIZE = RunPhase.PREPARE, RunPhase.WORK, RunPhase.FINALIZE
OK, FAILED = OutcomeStatus.OK, OutcomeStatus.FAILED


@dataclass(frozen=True)
class Instance:
    """One started process of a run (``dj-process`` or ``dj-elastic run`` on one node)."""

    instance_id: str
    node_id: str
    hostname: str
    boot_id: str
    pid: int
    pid_namespace: str = ""

    @classmethod
    def of(cls, identity: WorkerIdentity, instance_id: str) -> Instance:
        return cls(instance_id, **asdict(identity))

    @classmethod
    def holding(cls, claim: Claim) -> Instance:
        """The instance holding a role: its claim names it (the instance id is the claim's attempt id)."""
        return cls(claim.attempt_id, claim.node_id, claim.hostname, claim.boot_id, claim.pid, claim.pid_namespace)

    def describe(self) -> str:
        return f"{self.node_id} ({self.hostname} pid {self.pid})"


@dataclass(frozen=True)
class RunRecord(Record):
    """``run.json``: which run id this directory belongs to (first instance writes it)."""

    KIND: ClassVar[str] = "run"
    run_id: str
    source: str  # where the run id came from: "elastic.run_id", "SLURM_JOB_ID", ..., "derived"
    created_at: float
    created_by: str  # instance id


@dataclass(frozen=True)
class PrepareResult(Record):
    """``prepare.result.json``: the leader validated (and if needed split) the job for this run."""

    KIND: ClassVar[str] = "prepare-result"
    run_id: str
    instance_id: str
    job_id: str
    created: bool  # False: the job was already prepared (identical request)
    num_shards: int
    recipe_hash: str
    finished_at: float


@dataclass(frozen=True)
class Outcome(Record):
    """``outcome.json``: how the run ended, once for every instance (first link wins): ``ok``, finalized
    (``details``: the merge result), or ``failed``, with the error every instance reports."""

    KIND: ClassVar[str] = "outcome"
    run_id: str
    status: OutcomeStatus
    phase: RunPhase
    instance: Instance
    decided_at: float
    error_type: str | None = None
    message: str | None = None
    where: str | None = None
    hint: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class Participant(Record):
    """``participants/<instance_id>.json``: an instance that joined the run (rewritten when it leaves)."""

    KIND: ClassVar[str] = "participant"
    run_id: str
    instance: Instance
    slots: int
    joined_at: float
    left_at: float | None = None
    exit_reason: ParticipantExit | None = None
    shards_done: int | None = None


MAX_MESSAGE_CHARS: Final = 4000


def error_from_outcome(outcome: Outcome) -> ElasticError:
    """The error a failed outcome describes, as the same class when it is one of ours."""
    cls = getattr(errors, outcome.error_type or "", None)
    if not (isinstance(cls, type) and issubclass(cls, ElasticError)):
        cls = ElasticError
    return cls(outcome.message or "the run was aborted", where=outcome.where, hint=outcome.hint)


def run_keys(layout: JobLayout) -> list[str]:
    """The runs' directories under ``coordination/``: one listing, in its order."""
    keys = []
    for key in fsio.list_names(layout.coordination_dir):
        try:
            layout.run_dir(key)
        except JobDirError:
            continue  # not a run directory (temp files, foreign names)
        keys.append(key)
    return keys


def read_into(errors: list[str], record_type: type[R], path: Path) -> R | None:
    """The record at ``path``; None when there is none, or when it is unreadable: then its error
    is added to ``errors`` (an unreadable record is shown as such, never as a success)."""
    record, error = record_type.read_or_error(path)
    if error:
        errors.append(error)
    return record


def read_participants(layout: JobLayout, key: str, errors: list[str]) -> list[Participant]:
    """The run's participants by the time they joined (``errors``: as :func:`read_into`)."""
    directory = layout.participants_dir(key)
    names = [name for name in fsio.list_names(directory) if not name.startswith(".") and name.endswith(".json")]
    found = [read_into(errors, Participant, directory / name) for name in names]
    return sorted((p for p in found if p is not None), key=lambda p: p.joined_at)


def newest_run(layout: JobLayout) -> tuple[RunRecord, Outcome | None] | None:
    """The newest run's record (by its time) and its outcome: one listing of ``coordination/``, the
    run records, then one outcome.  Display only: an unreadable record counts as none."""
    newest: tuple[RunRecord, str] | None = None
    for key in run_keys(layout):
        try:
            record = RunRecord.read(layout.run_record(key))
        except (OSError, JobDirError):
            continue  # a corrupt record
        if record is not None and (newest is None or record.created_at > newest[0].created_at):
            newest = (record, key)
    if newest is None:
        return None
    record, key = newest
    try:
        return record, Outcome.read(layout.outcome(key))
    except (OSError, JobDirError):
        return record, None


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
        self.roles: dict[RunPhase, Role] = {}  # made when first used (tests set the identity first)

    @property
    def instance_id(self) -> str:
        return self.instance.instance_id

    def join(self, slots: int = 1) -> None:
        """Create the run directory, check it is ours, and register this instance."""
        ensure_dir(self.layout, self.layout.participants_dir(self.key))
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
        errors: list[str] = []
        found = read_participants(self.layout, self.key, errors)
        for error in errors:
            logger.warning(f"ignoring corrupt participant record: {error}")
        return found

    def role(self, phase: RunPhase) -> Role:
        if phase not in self.roles:
            layout = self.layout.role_lease(self.key, phase)
            self.roles[phase] = Role(
                layout, self.identity, ttl_secs=self.ttl_secs, heartbeat_secs=self.heartbeat_secs, clock=self.clock
            )
        return self.roles[phase]

    def elect(self, phase: RunPhase) -> tuple[bool, Instance]:
        """(we won, the leader): exactly one instance of the run, the first to claim, holds each role."""
        role = self.role(phase)
        if role.claim is None and role.acquire(self.instance_id, take_over=False) is not None:
            logger.info(f"elected as {phase} coordinator of run {self.run.value}")
            return True, self.instance
        leader = self.leader(phase)
        if leader is None:  # unreadable: no instance can act on it, so nobody will publish a result
            raise JobDirError(
                f"the {phase} role's claim is unreadable", where=str(role.layout.tasks_root), hint="re-submit the job"
            )
        return leader.instance_id == self.instance_id, leader

    def leader(self, phase: RunPhase) -> Instance | None:
        claim, _ = read_holder(self.role(phase).layout)
        return None if claim is None else Instance.holding(claim)

    @contextlib.contextmanager
    def holding(self, phase: RunPhase) -> Iterator[None]:
        """The elected role renewed while the body runs, and released once it published its result;
        a failure stops the renewal only (waiters read the outcome, or see the heartbeat stop)."""
        role = self.role(phase)
        role.heartbeater.start()
        try:
            yield
        except BaseException:
            role.stop()
            raise
        role.release(ReleaseReason.FINISHED, f"the {phase} role")

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
        ensure_dir(self.layout, self.dir)
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
            # this instance reports the phase's own error; the others see its role's heartbeat stop.
            logger.warning(f"could not record the end of run {self.run.value}: {exc}")
            if isinstance(error, ElasticError):
                raise error from None
            root = self.layout.root
            raise errors.storage_error(exc, root, "run the job again", (("job directory", root),)) from None

    def raise_if_aborted(self) -> None:
        outcome = self.outcome()
        if outcome is not None and not outcome.ok:
            raise_outcome(outcome)

    def await_phase(self, phase: RunPhase, leader: Instance, done: Callable[[], Any]) -> Any:
        """Poll ``done()`` until it returns a value; raise the run's abort, or abort when the leader is
        gone: its role could be taken over (its pid gone on this host, or its heartbeat unchanged for a
        TTL on this instance's clock); the run is not, a resubmission is (docs/multinode.md)."""
        role = self.role(phase)
        logger.info(f"waiting for the {phase} coordinator {leader.describe()}")
        while True:
            value = done()
            if value is not None:
                return value
            self.raise_if_aborted()
            reason = role.takeover_reason()
            if reason is not None:
                if reason == TakeoverReason.HOLDER_DEAD:
                    lost = "exited"
                elif reason == TakeoverReason.STALE:
                    lost = f"stopped renewing its heartbeat for {self.ttl_secs:g}s (killed, lost or hung)"
                else:
                    lost = f"gave its role up ({reason})"
                raise_outcome(
                    self.abort(
                        phase,
                        CoordinatorLostError(
                            f"the {phase} coordinator {leader.describe()} {lost} before publishing a result",
                            where=f"run {self.run.value}",
                            hint="re-submit the job (a new submission gets a new coordination generation and "
                            "reuses every finished shard)",
                        ),
                    )
                )
            self.sleep(self.poll_secs)


def raise_outcome(outcome: Outcome) -> NoReturn:
    raise error_from_outcome(outcome)
