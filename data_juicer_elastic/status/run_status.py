"""The runs (submissions) of a job, newest first, from ``coordination/<run-key>/``: leaders,
outcome and participants; an unreadable record is shown as such, never as a success."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from data_juicer_elastic.coordination.run import (
    FINALIZE,
    PREPARE,
    Instance,
    Outcome,
    PrepareResult,
    RunRecord,
    read_into,
    read_participants,
    run_keys,
)
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.roles import read_holder
from data_juicer_elastic.status.job_times import wall_secs


def runs(job_dir: str | Path) -> list[dict[str, Any]]:
    """Every run of the job, newest first, as plain JSON data."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    found = [_run(layout, key) for key in run_keys(layout)]
    return sorted(found, key=lambda r: r.get("created_at") or 0.0, reverse=True)


def _run(layout: JobLayout, key: str) -> dict[str, Any]:
    errors: list[str] = []
    run = read_into(errors, RunRecord, layout.run_record(key))
    info: dict[str, Any] = {
        "run_key": key,
        "run_id": run.run_id if run else None,
        "source": run.source if run else None,
        "created_at": run.created_at if run else None,
        "errors": errors,
    }
    for phase in (PREPARE, FINALIZE):
        holder, error = read_holder(layout.role_lease(key, phase))
        if error:
            errors.append(error)
        info[f"{phase}_leader"] = Instance.holding(holder).describe() if holder else None
    info["prepared"] = read_into(errors, PrepareResult, layout.prepare_result(key)) is not None
    outcome = read_into(errors, Outcome, layout.outcome(key))
    info["outcome"] = None
    if run is not None:  # the run's wall time, by the one rule the closing summary and the report use
        ended = outcome.decided_at if outcome else None
        info["ended_at"], info["wall_secs"] = ended, round(wall_secs(run.created_at, ended), 3)
    if outcome is not None:
        info["outcome"] = {
            "status": outcome.status,
            "phase": outcome.phase,
            "by": outcome.instance.describe(),
            "error": f"{outcome.error_type}: {outcome.message}" if not outcome.ok else None,
            "details": outcome.details,
        }
    info["participants"] = [
        {
            "instance_id": record.instance.instance_id,
            "node_id": record.instance.node_id,
            "host": record.instance.hostname,
            "pid": record.instance.pid,
            "slots": record.slots,
            "joined_at": record.joined_at,
            "left_at": record.left_at,
            "exit_reason": record.exit_reason,
            "shards_done": record.shards_done,
        }
        for record in read_participants(layout, key, errors)
    ]
    return info


def run_state(run: dict[str, Any]) -> str:
    """How a run stands, as ``status`` and the report say it."""
    outcome = run.get("outcome")
    if outcome is None:
        return "in progress" if run.get("prepared") else "preparing"
    if outcome.get("status") == "ok":
        return f"finalized by {outcome.get('by')}"
    return f"FAILED in {outcome.get('phase')} ({outcome.get('by')}): {outcome.get('error')}"
