"""Versioned records of one run's coordination (``<job_dir>/coordination/<run-key>/``).

Same conventions as ``jobdir.records``: ``{"format": "dj-elastic/<kind>", "version": 1}``,
one parse per kind, and a malformed record is an error, never a success.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from data_juicer_elastic.jobdir.lease_records import Claim
from data_juicer_elastic.jobdir.records import Record
from data_juicer_elastic.sharedfs.identity import WorkerIdentity


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
