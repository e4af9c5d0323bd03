"""When a job's run was submitted, had its first shard running, its last shard done, and ended:
the one set of times the console, ``status`` and the report show (``docs/status.md``, ``times``).

Read from the run's record, the worker processes' pace records (one listing and one small read
per process, never one per shard), the run's outcome and the merge record (``merge.json``: a
job run by ``dj-elastic worker`` and merged by ``dj-elastic merge`` has no outcome, and a job
re-run after ``dj-elastic retry`` ends at its later merge, not at the first run's outcome).  All
are the wall clocks of the nodes that wrote them: display only, nothing is decided from them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from data_juicer_elastic.coordination.run import OK, newest_run
from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.exports import MergeRecord
from data_juicer_elastic.jobdir.job_summary import PaceRecord, read_paces
from data_juicer_elastic.jobdir.layout import JobLayout


@dataclass(frozen=True)
class JobTimes:
    run_id: str | None  # None: no run record (the plan's time stands for the submission)
    submitted_at: float
    first_running_at: float | None
    last_done_at: float | None
    # the job's end: its outcome decided (finalized or aborted) or its export merged, whichever is
    # latest and not before the last accepted result; None while it runs or while shards are left
    finalized_at: float | None
    ok: bool | None  # finalized (True), aborted (False), running (None)

    def wall_secs(self, now: float | None = None) -> float:
        return wall_secs(self.submitted_at, self.finalized_at, now)

    def first_shard_secs(self) -> float | None:
        """From the submission to the first shard running."""
        return None if self.first_running_at is None else max(0.0, self.first_running_at - self.submitted_at)

    def last_shard_secs(self) -> float | None:
        """From the submission to the last accepted result."""
        return None if self.last_done_at is None else max(0.0, self.last_done_at - self.submitted_at)

    def to_json(self, now: float | None = None) -> dict:
        return {
            "run_id": self.run_id,
            "submitted_at": self.submitted_at,
            "first_shard_running_at": self.first_running_at,
            "last_shard_done_at": self.last_done_at,
            "finalized_at": self.finalized_at,
            "ok": self.ok,
            "wall_secs": round(self.wall_secs(now), 3),
            "first_shard_secs": _round(self.first_shard_secs()),
            "last_shard_secs": _round(self.last_shard_secs()),
        }


def wall_secs(started_at: float, ended_at: float | None, now: float | None = None) -> float:
    """A run's wall time: from its record to its outcome, or to ``now`` while it runs."""
    end = ended_at if ended_at is not None else (time.time() if now is None else now)
    return max(0.0, end - started_at)


def _round(secs: float | None) -> float | None:
    return None if secs is None else round(secs, 3)


def format_wall(secs: float) -> str:
    """A duration as every surface writes it: ``23.2s``, ``4m05s``, ``1h02m03s``."""
    if secs < 60:
        return f"{secs:.1f}s"
    minutes, secs = divmod(int(secs), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def utc_stamp(when: float) -> str:
    """A wall-clock time as every surface writes it: ``2026-12-01 20:06:56 UTC``."""
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def job_times(
    layout: JobLayout,
    *,
    planned_at: float | None = None,
    paces: list[PaceRecord] | None = None,
    attempt_starts: Iterable[float] = (),
    runs: list[dict] | None = None,
    complete: bool | None = None,
) -> JobTimes | None:
    """The times of the job's newest run; None when there is neither a run record nor a
    ``planned_at``.  ``paces``, ``runs`` (``run_status.runs``): what the caller read already;
    ``complete``: whether every shard is done (False: no finalize time shows; None: not known)."""
    run = _newest(runs) if runs is not None else _latest_run(layout)
    if run is None and planned_at is None:
        return None
    submitted = run.created_at if run is not None else planned_at
    mine = [p for p in (read_paces(layout) if paces is None else paces) if p.updated_at >= submitted]
    firsts = [p.first_claimed_at for p in mine if p.first_claimed_at is not None]
    if not mine:
        firsts = [t for t in attempt_starts if t >= submitted]
    lasts = [p.last_done_at for p in mine if p.last_done_at is not None]
    last_done = max(lasts) if lasts else None
    outcome = (run.decided_at, run.ok) if run is not None and run.decided_at is not None else None
    merged_at = _merged_at(layout)
    if merged_at is not None and merged_at < submitted:  # an earlier run's merge is not this one's end
        merged_at = None
    finalized_at, ok = _end(outcome, merged_at, last_done, complete)
    return JobTimes(
        run_id=run.run_id if run is not None else None,
        submitted_at=submitted,
        first_running_at=min(firsts) if firsts else None,
        last_done_at=last_done,
        finalized_at=finalized_at,
        ok=ok,
    )


def _end(outcome: tuple[float, bool | None] | None, merged_at: float | None, last_done: float | None, complete):
    """The job's end (time, ok), or (None, None) while it runs.  An end before the last accepted
    result was an earlier pass's (the results after it came from shards a retry requeued); a job
    with shards left is not finalized (an abort still ended it).  The run's own finalize, where it
    stands, is the end (a later re-merge of the export moves nothing); else the later of the merge
    (a job of ``dj-elastic worker`` + ``merge``, or rerun after a retry) and an abort."""
    merged = (merged_at, True) if merged_at is not None else None
    ends = [
        end
        for end in (outcome, merged)
        if end is not None and (last_done is None or end[0] >= last_done) and not (complete is False and end[1])
    ]
    if outcome in ends and outcome[1]:
        return outcome
    return max(ends, key=lambda end: end[0]) if ends else (None, None)


def _merged_at(layout: JobLayout) -> float | None:
    """When ``merge.json`` was written (one small read); None without one, for a record too old
    to carry its time (0.0), or an unreadable one (``verify`` names it)."""
    try:
        record = MergeRecord.read(layout.merge_record)
    except (OSError, JobDirError):
        return None
    return record.merged_at if record is not None and record.merged_at > 0 else None


class _Run(NamedTuple):
    run_id: str
    created_at: float
    decided_at: float | None
    ok: bool | None


def _newest(runs: list[dict]) -> _Run | None:
    """The newest run of ``run_status.runs`` (newest first) that has a readable record."""
    for run in runs:
        if run["run_id"] is not None and run["created_at"] is not None:
            outcome = run["outcome"]
            return _Run(run["run_id"], run["created_at"], run["ended_at"], outcome and outcome["status"] == OK)
    return None


def _latest_run(layout: JobLayout) -> _Run | None:
    """The newest run's record and its outcome (``coordination.run.newest_run``)."""
    newest = newest_run(layout)
    if newest is None:
        return None
    record, outcome = newest
    decided, ok = (outcome.decided_at, outcome.ok) if outcome is not None else (None, None)
    return _Run(record.run_id, record.created_at, decided, ok)
