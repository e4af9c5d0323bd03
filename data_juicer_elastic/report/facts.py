"""Read a job directory into the facts a report shows.  Read-only: it never writes to the job.

Shard states, times and runs are read as ``dj-elastic status`` reads them (``status.job_view``);
the attempts and size traces here.  Which records each part reads: ``docs/report.md``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.batching.runtime import BatchTrace
from data_juicer_elastic.jobdir.exports import MergeRecord
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import Manifest
from data_juicer_elastic.jobdir.shard_state import ShardState
from data_juicer_elastic.report.attempt_facts import AttemptFact, AttemptOutcome, Warnings, read_or_warn, shard_attempts
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.status.job_times import JobTimes
from data_juicer_elastic.status.job_view import JobView, read_view
from data_juicer_elastic.status.snapshot_types import ShardStatus

MAX_TRACE_FILES: Final = 400  # size-trace files read at most (attempts with the most OOMs first)


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

    @property
    def times(self) -> JobTimes | None:
        return self.view.times

    @property
    def runs(self) -> list[dict[str, Any]]:
        return self.view.runs


def gather(job_dir: str | Path, now: float | None = None) -> JobFacts:
    """Everything the report shows about ``job_dir``; JobDirError when it is not a prepared job.
    Shard states, the job's times and its runs are ``status``'s (``status.job_view``), so the
    report and ``status`` agree; the attempts are read here."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    now = time.time() if now is None else now
    warnings = Warnings()
    ttl = manifest.settings.get("lease_ttl_secs")
    # as `dj-elastic status` reads it: from the job summary where there is one (no read per done shard)
    view = read_view(layout.root, ttl_secs=float(ttl) if ttl else None, now=now, manifest=manifest)
    attempted = set(fsio.list_names(layout.attempts_dir))
    all_attempts: list[AttemptFact] = []
    for entry, status in zip(manifest.shards, view.snapshot.shards, strict=True):
        all_attempts += shard_attempts(layout, entry, status, entry.shard_id in attempted, now, ttl, warnings)
    traces, skipped = _traces(layout, all_attempts, warnings)
    facts = JobFacts(
        job_dir=layout.root,
        taken_at=now,
        manifest=manifest,
        view=view,
        attempts=all_attempts,
        traces=traces,
        traces_skipped=skipped,
        merge=_merge_record(layout, warnings),
        warnings=list(warnings),
    )
    if warnings.dropped:
        facts.warnings.append(f"... and {warnings.dropped} more unreadable records")
    return facts


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


def _merge_record(layout: JobLayout, warnings: Warnings) -> MergeRecord | None:
    return read_or_warn(MergeRecord, layout.merge_record, warnings)
