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

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import Manifest
from data_juicer_elastic.jobdir.result_records import MergeRecord
from data_juicer_elastic.jobdir.shard_state import (
    Markers,
    ShardState,
    decide_state,
    read_failed_marker,
    read_markers,
)
from data_juicer_elastic.report.attempt_facts import (
    AttemptFact,
    AttemptOutcome,
    Warnings,
    read_or_warn,
    shard_attempts,
)
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.status.job_times import JobTimes, job_times
from data_juicer_elastic.status.scan_phase import scanned_phase

MAX_TRACE_FILES: Final = 400  # size-trace files read at most (attempts with the most OOMs first)


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
    times: JobTimes | None = None  # the latest run's times (status.job_times: the console and status say the same)

    @property
    def counts(self) -> dict[ShardState, int]:
        found = {state: 0 for state in ShardState}
        for shard in self.shards:
            found[shard.state] += 1
        return found


def gather(job_dir: str | Path, now: float | None = None) -> JobFacts:
    """Everything the report shows about ``job_dir``; JobDirError when it is not a prepared job."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    now = time.time() if now is None else now
    warnings = Warnings()
    ttl = manifest.settings.get("lease_ttl_secs")
    done_ids = _record_names(layout.done_dir)
    failed_ids = _record_names(layout.failed_dir)
    attempted = set(fsio.list_names(layout.attempts_dir))
    shards: list[ShardFact] = []
    all_attempts: list[AttemptFact] = []
    for entry in manifest.shards:
        attempted_here, done_here = entry.shard_id in attempted, entry.shard_id in done_ids
        found = shard_attempts(layout, entry, attempted_here, done_here, now, ttl, warnings)
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
        times=_times(layout, manifest, all_attempts),
    )
    if warnings.dropped:
        facts.warnings.append(f"... and {warnings.dropped} more unreadable records")
    return facts


def _times(layout: JobLayout, manifest: Manifest, found: list[AttemptFact]) -> JobTimes | None:
    phase = scanned_phase(manifest)
    starts = [a.started_at for a in found]
    return job_times(layout, planned_at=phase.planned_at if phase else None, attempt_starts=starts)


def _record_names(directory: Path) -> set[str]:
    return {name[: -len(".json")] for name in fsio.list_names(directory) if name.endswith(".json")}


def _shard_fact(layout, entry, found, done_ids, failed_ids, warnings) -> ShardFact:
    shard = entry.shard_id
    errors = [a.error for a in found if a.outcome in (AttemptOutcome.FAILED, AttemptOutcome.LOST) and a.error]
    last_error = errors[-1] if errors else None
    accepted = any(a.outcome is AttemptOutcome.DONE for a in found)
    if shard in done_ids and accepted:
        markers = Markers(shard, known_done=True)
    elif shard in done_ids:  # a marker we could not tie to an attempt: read it to tell done from corrupt
        markers = read_markers(layout, shard, failed=False)
    elif shard in failed_ids:
        markers = read_failed_marker(layout, Markers(shard))
    else:
        markers = Markers(shard)
    running = [a for a in found if a.outcome is AttemptOutcome.RUNNING]
    state = decide_state(markers, held=bool(running), stale=bool(running) and running[-1].stale)
    if markers.last_error is not None:
        last_error = markers.last_error
    return ShardFact(shard, entry.index, entry.rows, entry.bytes, state, len(found), last_error)


def _traces(layout: JobLayout, found: list[AttemptFact], warnings: Warnings) -> tuple[list[TraceFact], int]:
    """Size traces of the attempts that used adaptive batching, most OOMs first, bounded."""
    from data_juicer_elastic.batching.runtime import BatchTrace  # the record's owner (imports no Ray/torch)

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


def _runs(layout: JobLayout, warnings: Warnings) -> list[dict[str, Any]]:
    from data_juicer_elastic.status.run_status import runs  # read-only view of coordination/<run>/

    try:
        return runs(layout.root)
    except (OSError, JobDirError) as exc:
        warnings.add(f"coordination records: {exc}")
        return []


def _merge_record(layout: JobLayout, warnings: Warnings) -> MergeRecord | None:
    return read_or_warn(MergeRecord, layout.merge_record, warnings)
