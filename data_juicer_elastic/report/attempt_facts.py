"""The report's facts about attempts: how each attempt of a shard started and ended.

Read from the shard's ``attempt.json`` records.  The attempt that holds a shard's claim is
``status``'s: its state (running or stale), heartbeat age and progress record come from the
job view, so the report and ``dj-elastic status`` judge a running attempt alike.  For another
attempt that has not recorded its end, the shard's lease is read: the job summary ``status``
reads lags up to one round, so a shard claimed since shows pending there, and its attempt is
running, not lost.  Failure and heartbeat records are read only for an attempt that ended
without recording its end (its worker died), to say how and when it ended.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import attempts, heartbeats, task_queue
from data_juicer_elastic.jobdir.heartbeats import ProgressRecord, looks_stale, read_attempt_progress
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import AttemptExit, AttemptRecord, FailureReason, Heartbeat, ShardEntry
from data_juicer_elastic.jobdir.shard_state import ShardState, is_held
from data_juicer_elastic.jobdir.task_queue import list_failures
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.status.snapshot_types import ShardStatus

MAX_WARNINGS: Final = 50


class AttemptOutcome(enum.StrEnum):
    """How one attempt ended, as the report colours it."""

    DONE = "done"  # its result is the shard's accepted result
    DISCARDED = "discarded"  # finished, but another attempt had published first
    FAILED = "failed"  # the shard's processing failed (counts against the retry budget)
    LOST = "lost"  # lease lost or expired, worker killed, interrupted by a signal, worker fault
    RUNNING = "running"  # holds the shard's current claim and has not ended


_EXIT_OUTCOMES: Final = {
    AttemptExit.DONE: AttemptOutcome.DONE,
    AttemptExit.DISCARDED: AttemptOutcome.DISCARDED,
    AttemptExit.FAILED: AttemptOutcome.FAILED,
    AttemptExit.LOST: AttemptOutcome.LOST,
    AttemptExit.SIGNAL: AttemptOutcome.LOST,
    AttemptExit.WORKER_FAULT: AttemptOutcome.LOST,
}


@dataclass(frozen=True)
class AttemptFact:
    shard_id: str
    shard_index: int
    attempt_id: str
    generation: int
    ordinal: int  # 1 for the shard's first attempt, 2 for its first retry, ...
    node_id: str
    hostname: str
    pid: int
    started_at: float
    ended_at: float | None  # None while running
    end_estimated: bool  # the end was not recorded (worker died): last heartbeat or failure time
    outcome: AttemptOutcome
    detail: str  # exit reason as recorded (e.g. "lease-expired", "signal")
    input_rows: int
    input_bytes: int
    output_rows: int | None
    error: str | None
    batching: dict[str, Any] | None
    quarantined: int | None = None  # rows operators failed on, set aside (attempt.json; quarantine)
    heartbeat_age_secs: float | None = None  # running attempts: status's heartbeat age
    stale: bool = False  # running, but status shows the shard stale
    # running attempts: (writer's wall time, input rows read so far) from the live progress record, oldest first
    progress: tuple[tuple[float, int], ...] = ()
    stage: str | None = None  # running attempts: the progress record's stage (and operator)

    @property
    def retried(self) -> bool:
        return self.ordinal > 1

    def end_or(self, now: float) -> float:
        """The recorded end; for a running attempt ``now``, or its last heartbeat when stale (a worker
        that vanished a week ago must not stretch the charts to today)."""
        if self.ended_at is not None:
            return self.ended_at
        if self.stale and self.heartbeat_age_secs is not None:
            return max(self.started_at, now - self.heartbeat_age_secs)
        return max(now, self.started_at)


class Warnings(list):
    """Unreadable records are shown in the report, bounded, never taken for success."""

    dropped = 0

    def add(self, message: str) -> None:
        if len(self) < MAX_WARNINGS:
            self.append(message)
        else:
            self.dropped += 1


def read_or_warn(cls, path: Path, warnings: Warnings):
    try:
        return cls.read(path)
    except (OSError, JobDirError) as exc:
        warnings.add(str(exc))
        return None


def shard_attempts(
    layout: JobLayout, entry: ShardEntry, status: ShardStatus, attempted: bool, now: float, ttl, warnings: Warnings
) -> list[AttemptFact]:
    """The attempts of one shard, oldest first; ``status`` is the shard as ``dj-elastic status`` read it
    (``now``, ``ttl``: the heartbeat age and the stale hint of an attempt claimed since the job summary)."""
    shard = entry.shard_id
    records: list[AttemptRecord] = []
    if attempted:
        for name in fsio.list_names(layout.attempt_root(shard)):
            if name.startswith("."):
                continue
            try:
                path = layout.attempt_record(shard, name)
            except JobDirError as exc:
                warnings.add(f"attempts/{shard}: {exc}")
                continue
            record = read_or_warn(AttemptRecord, path, warnings)
            if record is not None:
                records.append(record)
    records.sort(key=lambda r: (r.generation, r.started_at))
    finished = [r.attempt_id for r in records if r.exit_reason == AttemptExit.DONE]
    # The accepted result is the done marker's: a shard that is not done has none (`dj-elastic retry`
    # archived it), and one that finished more than once (retried) names it in its marker.
    accepted = finished[0] if len(finished) == 1 and status.state is ShardState.DONE else None
    accepted_at: float | None = None
    if status.state is ShardState.DONE and accepted is None:  # retried, or its end never recorded (worker died)
        result, error = attempts.read_done(layout, shard)
        if error:
            warnings.add(error)
        if result is not None:
            accepted, accepted_at = result.attempt_id, result.published_at
    running = None  # the attempt holding the claim: status's, else (summary lag) the lease's
    if status.state in (ShardState.RUNNING, ShardState.STALE):
        stale = status.state is ShardState.STALE
        running = _Holder(status.attempt_id, status.heartbeat_age_secs, stale, status.progress)
    held = running.attempt_id if running is not None else None
    if any(r.ended_at is None and r.attempt_id not in (accepted, held) for r in records):
        lease = task_queue.read_lease(layout, shard)
        if running is None and lease.claim is not None and is_held(lease):  # claimed since the summary's round
            age = heartbeats.heartbeat_age(layout, shard, lease.generation, now)
            progress = read_attempt_progress(layout, shard, lease.claim.attempt_id)[0]
            running = _Holder(lease.claim.attempt_id, age, looks_stale(age, ttl), progress)
        failed = {f.attempt_id: f for f in list_failures(layout, shard)}
    else:
        failed = {}
    out = []
    for ordinal, record in enumerate(records, start=1):
        base = dict(
            shard_id=record.shard_id,
            shard_index=entry.index,
            attempt_id=record.attempt_id,
            generation=record.generation,
            ordinal=ordinal,
            node_id=record.node_id,
            hostname=record.hostname,
            pid=record.pid,
            started_at=record.started_at,
            input_rows=entry.rows,
            input_bytes=entry.bytes,
            output_rows=record.rows,
            error=record.error,
            batching=record.batching,
            quarantined=record.quarantined,
        )
        if record.ended_at is None and running is not None and record.attempt_id == running.attempt_id:
            out.append(_running(running, base))
        else:
            out.append(_ended(layout, record, accepted, accepted_at, failed, base))
    return out


class _Holder(NamedTuple):
    """The running attempt of a shard, as judged (by status, or from the lease)."""

    attempt_id: str | None
    heartbeat_age_secs: float | None
    stale: bool
    progress: ProgressRecord | None


def _running(holder: _Holder, base: dict[str, Any]) -> AttemptFact:
    points, stage = _live_progress(holder.progress)
    return AttemptFact(
        progress=points,
        stage=stage,
        ended_at=None,
        end_estimated=False,
        outcome=AttemptOutcome.RUNNING,
        detail="running",
        heartbeat_age_secs=holder.heartbeat_age_secs,
        stale=holder.stale,
        **base,
    )


def _ended(layout, record, accepted, accepted_at, failures, base: dict[str, Any]) -> AttemptFact:
    if record.ended_at is not None:
        outcome = _EXIT_OUTCOMES.get(record.exit_reason or "", AttemptOutcome.LOST)
        detail = record.exit_reason or "?"
        if outcome is AttemptOutcome.DONE and record.attempt_id != accepted:
            # not the accepted result: another attempt published first, or a retry requeued the shard
            outcome, detail = AttemptOutcome.DISCARDED, "done, then requeued by retry"
        return AttemptFact(ended_at=record.ended_at, end_estimated=False, outcome=outcome, detail=detail, **base)
    if record.attempt_id == accepted:
        end = accepted_at if accepted_at is not None else record.started_at
        return AttemptFact(ended_at=end, end_estimated=True, outcome=AttemptOutcome.DONE, detail="done", **base)
    # ended without a record (its worker died): the failure record says how, the last heartbeat when
    failure = failures.get(record.attempt_id)
    heartbeat = _last_heartbeat(layout, record)
    end = heartbeat if heartbeat is not None else (failure.failed_at if failure else record.started_at)
    if failure is not None:
        outcome = AttemptOutcome.FAILED if failure.exit_reason == FailureReason.ERROR else AttemptOutcome.LOST
        base["error"] = failure.error
        detail = failure.exit_reason
    else:
        outcome, detail = AttemptOutcome.LOST, "ended without a record"
    return AttemptFact(ended_at=max(end, record.started_at), end_estimated=True, outcome=outcome, detail=detail, **base)


def _live_progress(progress: ProgressRecord | None) -> tuple[tuple[tuple[float, int], ...], str | None]:
    """(time, rows read) points of a running attempt's progress record, and its stage."""
    if progress is None:
        return (), None
    points = [(progress.started_at + float(s[0]), int(s[1])) for s in progress.samples if len(s) >= 2]
    points.append((progress.started_at + progress.elapsed_secs, progress.rows_read))
    stage = progress.stage + (f" ({progress.operator})" if progress.operator else "")
    return tuple(sorted(points)), stage


def _last_heartbeat(layout: JobLayout, record: AttemptRecord) -> float | None:
    try:
        beat = Heartbeat.read(layout.heartbeat(record.shard_id, record.generation))
    except (OSError, JobDirError):
        return None
    return beat.written_at if beat is not None and beat.attempt_id == record.attempt_id else None
