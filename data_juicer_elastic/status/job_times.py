"""How long a job's run took: the one duration the console, ``status`` and the report show.

A run starts when its first instance records it (``coordination/<run>/run.json``,
``created_at``) and ends when its outcome is decided (``outcome.json``, ``decided_at``:
finalized or aborted).  Its wall time is the difference, or "so far" while it runs.  Every
surface reads it here, so the closing summary, ``dj-elastic status`` and the HTML report say
the same, to the second, for the same run; the time a shell spent before ``dj-process``
started, or the interpreter's imports, are not in it.  Both times are wall clocks of the nodes
that wrote them (display only; nothing is decided from them).  Reads: one listing of
``coordination/`` and two small records per run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from data_juicer_elastic.coordination.run_records import Outcome, RunRecord
from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.sharedfs import fsio


@dataclass(frozen=True)
class RunTimes:
    run_id: str
    started_at: float  # the run's record: its first instance joined
    ended_at: float | None  # its outcome was decided (None while it runs)
    ok: bool | None  # finalized (True), aborted (False), running (None)

    def wall_secs(self, now: float | None = None) -> float:
        end = self.ended_at if self.ended_at is not None else (time.time() if now is None else now)
        return max(0.0, end - self.started_at)

    def to_json(self, now: float | None = None) -> dict:
        return {
            "run_id": self.run_id,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "ok": self.ok,
            "wall_secs": round(self.wall_secs(now), 3),
        }


def format_wall(secs: float) -> str:
    """A wall time as every surface writes it: ``23.2s``, ``4m05s``, ``1h02m03s``."""
    if secs < 60:
        return f"{secs:.1f}s"
    minutes, secs = divmod(int(secs), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def latest_run(layout: JobLayout) -> RunTimes | None:
    """The newest run of the job (by its record's time), or None for a job run without one
    (``dj-elastic worker`` and ``merge`` alone)."""
    newest: RunTimes | None = None
    for key in fsio.list_names(layout.coordination_dir):
        try:
            record = _read(RunRecord, layout.run_record(key))
        except JobDirError:
            continue  # not a run directory (temp files, foreign names), or a corrupt record
        if record is None or (newest is not None and record.created_at <= newest.started_at):
            continue
        try:
            outcome = _read(Outcome, layout.outcome(key))
        except JobDirError:
            outcome = None
        newest = RunTimes(
            record.run_id,
            record.created_at,
            outcome.decided_at if outcome is not None else None,
            outcome.ok if outcome is not None else None,
        )
    return newest


def _read(cls, path):
    try:
        data = fsio.read_record(path)
    except OSError as exc:
        raise JobDirError(str(exc), where=str(path)) from exc
    return None if data is None else cls.parse(data, path)
