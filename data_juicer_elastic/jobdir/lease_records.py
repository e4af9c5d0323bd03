"""The records of one claim generation of a shard: claim (never unlinked), heartbeat (rewritten by
the holder), and the release or failure that ends it (written by ``task_queue``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from data_juicer_elastic.jobdir.reasons import FailureReason, ReleaseReason, TakeoverReason
from data_juicer_elastic.jobdir.records import Record


@dataclass(frozen=True)
class Claim(Record):
    KIND: ClassVar[str] = "claim"
    shard_id: str
    generation: int
    attempt_id: str
    node_id: str
    hostname: str
    boot_id: str
    pid: int
    pid_namespace: str
    claimed_at: float  # wall clock, informational only (never compared across nodes)
    takeover_of: int  # generation taken over (0 for the first claim)
    takeover_reason: TakeoverReason


@dataclass(frozen=True)
class Heartbeat(Record):
    KIND: ClassVar[str] = "heartbeat"
    shard_id: str
    generation: int
    attempt_id: str
    seq: int  # strictly increasing; observers watch it change, not the clock
    written_at: float  # wall clock, informational only


@dataclass(frozen=True)
class Release(Record):
    KIND: ClassVar[str] = "release"
    shard_id: str
    generation: int
    attempt_id: str
    reason: ReleaseReason
    released_at: float


@dataclass(frozen=True)
class Failure(Record):
    KIND: ClassVar[str] = "failure"
    shard_id: str
    generation: int
    attempt_id: str
    node_id: str
    hostname: str
    pid: int
    error: str
    error_type: str
    exit_reason: FailureReason  # reasons.DEATH_REASONS have a budget of their own
    failed_at: float
