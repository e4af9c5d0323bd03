"""The job's history for the report: the job view (``job_view.read_view``), and how each attempt of
each shard started and ended, the adaptive-batching size traces and the merge record.

An attempt's start and end come from its ``attempt.json``.  The attempt that holds a shard's claim
is the job view's: its state (running or stale), heartbeat age and progress record, so the report
and ``dj-elastic status`` judge a running attempt alike.  For another attempt that has not recorded
its end, the shard is read again by name (``job_status.read_shard``): the job summary the view
reads lags up to one round, so a shard claimed since shows pending there, and its attempt is
running, not lost.  Failure and heartbeat records are read only for an attempt that ended without
recording its end (its worker died), to say how and when it ended.  Which records each part reads:
``docs/report.md``.
"""

from __future__ import annotations

import enum
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.batching.runtime import BatchTrace
from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.exports import MergeRecord
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import (
    AttemptExit,
    AttemptRecord,
    FailureReason,
    Heartbeat,
    Manifest,
    ShardEntry,
)
from data_juicer_elastic.jobdir.shard_state import ShardState
from data_juicer_elastic.jobdir.task_queue import list_failures
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.status.job_status import read_shard
from data_juicer_elastic.status.job_view import JobView, read_view
from data_juicer_elastic.status.snapshot_types import ShardStatus

MAX_WARNINGS: Final = 50
MAX_TRACE_FILES: Final = 400  # size-trace files read at most (attempts with the most OOMs first)
_LIVE: Final = (ShardState.RUNNING, ShardState.STALE)


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


@dataclass(frozen=True)
class TraceFact:
    """One process's adaptive-batching size trace for one operator stage of one attempt."""

    shard_id: str
    attempt_id: str
    stage_key: str
    accelerator: str
    host: str
    pid: int
    seeded_from: str | None
    events: list[tuple[str, int, float, float | None]]  # (ok|oom, rows, cost, budget before), oldest first
    stats: dict[str, Any]


@dataclass
class JobFacts:
    job_dir: Path
    taken_at: float
    manifest: Manifest
    view: JobView  # the job as `dj-elastic status` reads it: shard states, times and runs
    attempts: list[AttemptFact]
    traces: list[TraceFact]
    traces_skipped: int
    merge: MergeRecord | None
    warnings: list[str] = field(default_factory=list)

    @property
    def shards(self) -> list[ShardStatus]:
        return self.view.snapshot.shards

    @property
    def counts(self) -> dict[ShardState, int]:
        return self.view.snapshot.counts


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


def read_history(job_dir: str | Path, now: float | None = None) -> JobFacts:
    """Everything the report shows about ``job_dir``; JobDirError when it is not a prepared job.
    Shard states, the job's times and its runs are ``status``'s (the job view, from the job summary
    where there is one: no read per done shard), so the report and ``status`` agree."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    now = time.time() if now is None else now
    warnings = Warnings()
    ttl = manifest.settings.get("lease_ttl_secs")
    ttl = float(ttl) if ttl else None
    view = read_view(layout.root, ttl_secs=ttl, now=now, manifest=manifest)
    attempted = set(fsio.list_names(layout.attempts_dir))
    reread = functools.partial(read_shard, layout, manifest, ttl_secs=ttl, now=now)
    found: list[AttemptFact] = []
    for entry, status in zip(manifest.shards, view.snapshot.shards, strict=True):
        found += _shard_attempts(layout, entry, status, entry.shard_id in attempted, reread, warnings)
    traces, skipped = _traces(layout, found, warnings)
    merge = read_or_warn(MergeRecord, layout.merge_record, warnings)
    facts = JobFacts(layout.root, now, manifest, view, found, traces, skipped, merge, list(warnings))
    if warnings.dropped:
        facts.warnings.append(f"... and {warnings.dropped} more unreadable records")
    return facts


def _shard_attempts(
    layout: JobLayout, entry: ShardEntry, status: ShardStatus, attempted: bool, reread: Callable, warnings: Warnings
) -> list[AttemptFact]:
    """The attempts of one shard, oldest first; ``status`` is the shard as the job view read it,
    ``reread(entry)`` reads it by name (``job_status.read_shard``)."""
    shard = entry.shard_id
    records: list[AttemptRecord] = []
    for name in fsio.list_names(layout.attempt_root(shard)) if attempted else ():
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
    holder = status if status.state in _LIVE else None  # the attempt holding the claim
    failed = {}
    if any(r.ended_at is None and r.attempt_id not in (accepted, holder and holder.attempt_id) for r in records):
        if holder is None:  # claimed since the summary's round: the shard read by name shows it running
            fresh = reread(entry)
            holder = fresh if fresh.state in _LIVE else None
        failed = {f.attempt_id: f for f in list_failures(layout, shard)}
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
        if record.ended_at is None and holder is not None and record.attempt_id == holder.attempt_id:
            out.append(_running(holder, base))
        else:
            out.append(_ended(layout, record, accepted, accepted_at, failed, base))
    return out


def _running(holder: ShardStatus, base: dict[str, Any]) -> AttemptFact:
    """A running attempt as the job view judged its shard, with the (time, rows read) points of its
    progress record and its stage."""
    points: list[tuple[float, int]] = []
    stage = None
    if (p := holder.progress) is not None:
        points = [(p.started_at + float(s[0]), int(s[1])) for s in p.samples if len(s) >= 2]
        points.append((p.started_at + p.elapsed_secs, p.rows_read))
        stage = p.stage + (f" ({p.operator})" if p.operator else "")
    return AttemptFact(
        progress=tuple(sorted(points)),
        stage=stage,
        ended_at=None,
        end_estimated=False,
        outcome=AttemptOutcome.RUNNING,
        detail="running",
        heartbeat_age_secs=holder.heartbeat_age_secs,
        stale=holder.state is ShardState.STALE,
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


def _last_heartbeat(layout: JobLayout, record: AttemptRecord) -> float | None:
    try:
        beat = Heartbeat.read(layout.heartbeat(record.shard_id, record.generation))
    except (OSError, JobDirError):
        return None
    return beat.written_at if beat is not None and beat.attempt_id == record.attempt_id else None


def _traces(layout: JobLayout, found: list[AttemptFact], warnings: Warnings) -> tuple[list[TraceFact], int]:
    """Size traces of the attempts that used adaptive batching, most OOMs first, bounded."""
    candidates = [a for a in found if a.batching is not None or a.outcome is AttemptOutcome.RUNNING]
    candidates.sort(key=lambda a: (-int((a.batching or {}).get("ooms") or 0), a.shard_index, a.ordinal))
    traces: list[TraceFact] = []
    budget, skipped = MAX_TRACE_FILES, 0
    for attempt in candidates:
        directory = layout.attempt_batching_dir(attempt.shard_id, attempt.attempt_id)
        names = sorted(n for n in fsio.list_names(directory) if n.endswith(".json") and not n.startswith("."))
        if len(names) > budget:
            skipped += len(names) - budget
            names = names[:budget]
        budget -= len(names)
        for name in names:
            trace = read_or_warn(BatchTrace, directory / name, warnings)
            if trace is None:
                continue
            try:
                events = [
                    (str(e[0]), int(e[1]), float(e[2]), None if e[3] is None else float(e[3]))
                    for e in trace.trace
                    if isinstance(e, list) and len(e) == 4
                ]
            except (TypeError, ValueError) as exc:  # the record's type check leaves the events untyped
                warnings.add(f"{directory / name}: malformed size trace: {exc}")
                continue
            traces.append(
                TraceFact(
                    shard_id=attempt.shard_id,
                    attempt_id=attempt.attempt_id,
                    stage_key=trace.stage_key,
                    accelerator=trace.accelerator,
                    host=trace.host,
                    pid=trace.pid,
                    seeded_from=trace.seeded_from,
                    events=events,
                    stats=trace.stats,
                )
            )
    return traces, skipped
