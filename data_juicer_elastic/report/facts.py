"""Read a job directory into the facts a report shows.  Read-only: it never writes to the job.

What is read, and why it stays cheap on a 10,000-shard job on NFS: the manifest,
one listing each of ``attempts/``, ``done/`` and ``failed/``, and per attempted
shard one listing plus one ``attempt.json`` per attempt.  Lease, failure and
heartbeat records are read only for shards with an attempt that never recorded
its end (running, or its worker died), and size traces only for attempts whose
``attempt.json`` says they used adaptive batching (or that are still running).

Clocks: start and end times are each worker's wall clock.  They are only
informational (never compared for correctness), and the report says so.
"""

from __future__ import annotations

import enum
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import attempts as attempt_records
from data_juicer_elastic.jobdir import leases
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.progress import read_progress
from data_juicer_elastic.jobdir.records import (
    AttemptRecord,
    Failure,
    Heartbeat,
    Manifest,
    MergeRecord,
    ShardEntry,
    ShardState,
)
from data_juicer_elastic.sharedfs import fsio

MAX_TRACE_FILES: Final = 400  # size-trace files read at most (attempts with the most OOMs first)
MAX_WARNINGS: Final = 50


class Outcome(enum.StrEnum):
    """How one attempt ended, as the report colours it."""

    DONE = "done"  # its result is the shard's accepted result
    DISCARDED = "discarded"  # finished, but another attempt had published first
    FAILED = "failed"  # the shard's processing failed (counts against the retry budget)
    LOST = "lost"  # lease lost or expired, worker killed, interrupted by a signal, worker fault
    RUNNING = "running"  # holds the shard's current claim and has not ended


_EXIT_OUTCOMES: Final = {
    "done": Outcome.DONE,
    "discarded": Outcome.DISCARDED,
    "failed": Outcome.FAILED,
    "lost": Outcome.LOST,
    "signal": Outcome.LOST,
    "worker-fault": Outcome.LOST,
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
    outcome: Outcome
    detail: str  # exit reason as recorded (e.g. "lease-expired", "signal")
    input_rows: int
    input_bytes: int
    output_rows: int | None
    error: str | None
    batching: dict[str, Any] | None
    heartbeat_age_secs: float | None = None  # running attempts: seconds since the heartbeat file changed
    stale: bool = False  # running, but its heartbeat is older than the lease TTL (display hint, as status)
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
class ShardFact:
    shard_id: str
    index: int
    rows: int
    bytes: int
    state: ShardState
    attempts: int
    last_error: str | None


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
    shards: list[ShardFact]
    attempts: list[AttemptFact]
    traces: list[TraceFact]
    traces_skipped: int
    runs: list[dict[str, Any]]
    merge: MergeRecord | None
    warnings: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[ShardState, int]:
        found = {state: 0 for state in ShardState}
        for shard in self.shards:
            found[shard.state] += 1
        return found


class _Warnings(list):
    """Unreadable records are shown in the report, bounded, never taken for success."""

    dropped = 0

    def add(self, message: str) -> None:
        if len(self) < MAX_WARNINGS:
            self.append(message)
        else:
            self.dropped += 1


def gather(job_dir: str | Path, now: float | None = None) -> JobFacts:
    """Everything the report shows about ``job_dir``; JobDirError when it is not a prepared job."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    now = time.time() if now is None else now
    warnings = _Warnings()
    ttl = manifest.settings.get("lease_ttl_secs")
    done_ids = _record_names(layout.done_dir)
    failed_ids = _record_names(layout.failed_dir)
    attempted = set(fsio.list_names(layout.attempts_dir))
    shards: list[ShardFact] = []
    all_attempts: list[AttemptFact] = []
    for entry in manifest.shards:
        attempted_here, done_here = entry.shard_id in attempted, entry.shard_id in done_ids
        found = _shard_attempts(layout, entry, attempted_here, done_here, now, ttl, warnings)
        all_attempts += found
        shards.append(_shard_fact(layout, entry, found, done_ids, failed_ids, warnings))
    traces, skipped = _traces(layout, all_attempts, warnings)
    facts = JobFacts(
        job_dir=layout.root,
        taken_at=now,
        manifest=manifest,
        shards=shards,
        attempts=all_attempts,
        traces=traces,
        traces_skipped=skipped,
        runs=_runs(layout, warnings),
        merge=_merge_record(layout, warnings),
        warnings=list(warnings),
    )
    if warnings.dropped:
        facts.warnings.append(f"... and {warnings.dropped} more unreadable records")
    return facts


def _record_names(directory: Path) -> set[str]:
    return {name[: -len(".json")] for name in fsio.list_names(directory) if name.endswith(".json")}


def _read(cls, path: Path, warnings: _Warnings):
    try:
        data = fsio.read_record(path)
        return cls.parse(data, path) if data is not None else None
    except (OSError, JobDirError) as exc:
        warnings.add(str(exc))
        return None


def _shard_attempts(
    layout: JobLayout, entry: ShardEntry, attempted: bool, done: bool, now: float, ttl, warnings: _Warnings
) -> list[AttemptFact]:
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
            record = _read(AttemptRecord, path, warnings)
            if record is not None:
                records.append(record)
    records.sort(key=lambda r: (r.generation, r.started_at))
    accepted = next((r.attempt_id for r in records if r.exit_reason == "done"), None)
    accepted_at: float | None = None
    if done and accepted is None:  # published, but the attempt's end was never recorded (worker died right after)
        result, error = attempt_records.read_done(layout, shard)
        if error:
            warnings.add(error)
        if result is not None:
            accepted, accepted_at = result.attempt_id, result.published_at
    unended = [r for r in records if r.ended_at is None and r.attempt_id != accepted]
    view = leases.read_lease(layout, shard) if unended else None
    failures = {f.attempt_id: f for f in attempt_records.list_failures(layout, shard)} if unended else {}
    out = []
    for ordinal, record in enumerate(records, start=1):
        out.append(_attempt_fact(layout, entry, record, ordinal, accepted, accepted_at, view, failures, now, ttl))
    return out


def _attempt_fact(layout, entry, record, ordinal, accepted, accepted_at, view, failures, now, ttl) -> AttemptFact:
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
    )
    if record.ended_at is not None:
        outcome = _EXIT_OUTCOMES.get(record.exit_reason or "", Outcome.LOST)
        if outcome is Outcome.DONE and record.attempt_id != accepted:
            outcome = Outcome.DISCARDED  # two "done" records cannot both be the accepted one
        return AttemptFact(
            ended_at=record.ended_at, end_estimated=False, outcome=outcome, detail=record.exit_reason or "?", **base
        )
    if record.attempt_id == accepted:
        end = accepted_at if accepted_at is not None else record.started_at
        return AttemptFact(ended_at=end, end_estimated=True, outcome=Outcome.DONE, detail="done", **base)
    claim = view.claim if view is not None else None
    if claim is not None and claim.attempt_id == record.attempt_id and not view.ended:
        age = _mtime_age(layout.heartbeat(record.shard_id, record.generation), now)
        points, stage = _live_progress(layout, record)
        return AttemptFact(
            progress=points,
            stage=stage,
            ended_at=None,
            end_estimated=False,
            outcome=Outcome.RUNNING,
            detail="running",
            heartbeat_age_secs=age,
            stale=isinstance(ttl, (int, float)) and age is not None and age > ttl,
            **base,
        )
    failure: Failure | None = failures.get(record.attempt_id)
    heartbeat = _last_heartbeat(layout, record)
    end = heartbeat if heartbeat is not None else (failure.failed_at if failure else record.started_at)
    if failure is not None:
        outcome = Outcome.FAILED if failure.exit_reason == "error" else Outcome.LOST
        base["error"] = failure.error
        detail = failure.exit_reason
    else:
        outcome, detail = Outcome.LOST, "ended without a record"
    return AttemptFact(ended_at=max(end, record.started_at), end_estimated=True, outcome=outcome, detail=detail, **base)


def _live_progress(layout: JobLayout, record: AttemptRecord) -> tuple[tuple[tuple[float, int], ...], str | None]:
    """(time, rows read) points of a running attempt's progress record, and its stage; informational, so an
    unreadable record only means no live throughput for it."""
    progress, _ = read_progress(layout, record.shard_id, record.attempt_id)
    if progress is None:
        return (), None
    points = [(progress.started_at + float(s[0]), int(s[1])) for s in progress.samples if len(s) >= 2]
    points.append((progress.started_at + progress.elapsed_secs, progress.rows_read))
    stage = progress.stage + (f" ({progress.operator})" if progress.operator else "")
    return tuple(sorted(points)), stage


def _mtime_age(path: Path, now: float) -> float | None:
    try:
        return max(0.0, now - fsio.stat(path).st_mtime)
    except OSError:
        return None


def _last_heartbeat(layout: JobLayout, record: AttemptRecord) -> float | None:
    try:
        data = fsio.read_record(layout.heartbeat(record.shard_id, record.generation))
        beat = Heartbeat.parse(data, "heartbeat") if data is not None else None
    except (OSError, JobDirError):
        return None
    return beat.written_at if beat is not None and beat.attempt_id == record.attempt_id else None


def _shard_fact(layout, entry, found, done_ids, failed_ids, warnings) -> ShardFact:
    shard = entry.shard_id
    errors = [a.error for a in found if a.outcome in (Outcome.FAILED, Outcome.LOST) and a.error]
    last_error = errors[-1] if errors else None
    accepted = any(a.outcome is Outcome.DONE for a in found)
    if shard in done_ids and accepted:
        state = ShardState.DONE
    elif shard in done_ids:  # a marker we could not tie to an attempt: read it to tell done from corrupt
        result, error = attempt_records.read_done(layout, shard)
        state = ShardState.DONE if result is not None else ShardState.FAILED
        if error:
            last_error = f"corrupt done marker: {error}"
    elif shard in failed_ids:
        terminal, error = attempt_records.read_terminal(layout, shard)
        state = ShardState.FAILED
        last_error = terminal.last_error if terminal else f"corrupt failed marker: {error}"
    else:
        running = [a for a in found if a.outcome is Outcome.RUNNING]
        if not running:
            state = ShardState.PENDING
        else:
            state = ShardState.STALE if running[-1].stale else ShardState.RUNNING
    return ShardFact(shard, entry.index, entry.rows, entry.bytes, state, len(found), last_error)


def _traces(layout: JobLayout, found: list[AttemptFact], warnings: _Warnings) -> tuple[list[TraceFact], int]:
    """Size traces of the attempts that used adaptive batching, most OOMs first, bounded."""
    from data_juicer_elastic.batching.runtime import BatchTrace  # the record's owner (imports no Ray/torch)

    candidates = [a for a in found if a.batching is not None or a.outcome is Outcome.RUNNING]
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
            trace = _read(BatchTrace, directory / name, warnings)
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


def _runs(layout: JobLayout, warnings: _Warnings) -> list[dict[str, Any]]:
    from data_juicer_elastic.status.run_status import runs  # read-only view of coordination/<run>/

    try:
        return runs(layout.root)
    except (OSError, JobDirError) as exc:
        warnings.add(f"coordination records: {exc}")
        return []


def _merge_record(layout: JobLayout, warnings: _Warnings) -> MergeRecord | None:
    return _read(MergeRecord, layout.merge_record, warnings)
