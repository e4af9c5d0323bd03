"""Read-only view of a job's coordination records, and ``dj-elastic status`` (once or ``--watch``).

Each run (submission) has a directory ``coordination/<run-key>/``; this lists the
runs newest first with their leaders, outcome and participants.  Nothing here
writes, and an unreadable record is shown as such, never as a success.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Final

import orjson

from data_juicer_elastic.coordination.run_records import (
    FINALIZE,
    PREPARE,
    Leader,
    Outcome,
    Participant,
    PrepareResult,
    RunRecord,
)
from data_juicer_elastic.errors import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_OK, ConfigError, JobDirError
from data_juicer_elastic.jobdir.confine import not_a_directory
from data_juicer_elastic.jobdir.heartbeats import StalenessObserver
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_job, load_plan
from data_juicer_elastic.jobdir.records import FORMAT_PREFIX, VERSION
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.status.job_status import snapshot, snapshot_json
from data_juicer_elastic.status.job_times import RunTimes, format_wall
from data_juicer_elastic.status.scan_phase import read_scan_phase, scan_text
from data_juicer_elastic.status.status_text import render_text


def _read(cls, path: Path) -> tuple[Any, str | None]:
    try:
        data = fsio.read_record(path)
        return (cls.parse(data, path) if data is not None else None), None
    except JobDirError as exc:
        return None, str(exc)


def runs(job_dir: str | Path) -> list[dict[str, Any]]:
    """Every run of the job, newest first, as plain JSON data."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    found = []
    for key in fsio.list_names(layout.coordination_dir):
        try:
            layout.run_dir(key)
        except JobDirError:
            continue  # not a run directory (temp files, foreign names)
        found.append(_run(layout, key))
    return sorted(found, key=lambda r: r.get("created_at") or 0.0, reverse=True)


def _run(layout: JobLayout, key: str) -> dict[str, Any]:
    run, run_error = _read(RunRecord, layout.run_record(key))
    info: dict[str, Any] = {
        "run_key": key,
        "run_id": run.run_id if run else None,
        "source": run.source if run else None,
        "created_at": run.created_at if run else None,
        "errors": [run_error] if run_error else [],
    }
    for phase in (PREPARE, FINALIZE):
        leader, error = _read(Leader, layout.leader(key, phase))
        info[f"{phase}_leader"] = leader.instance.describe() if leader else None
        if error:
            info["errors"].append(error)
    prepared, error = _read(PrepareResult, layout.prepare_result(key))
    info["prepared"] = prepared is not None
    if error:
        info["errors"].append(error)
    outcome, error = _read(Outcome, layout.outcome(key))
    if error:
        info["errors"].append(error)
    info["outcome"] = None
    if run is not None:  # the run's wall time, by the one rule the closing summary and the report use
        times = RunTimes(run.run_id, run.created_at, outcome.decided_at if outcome else None, None)
        info["ended_at"], info["wall_secs"] = times.ended_at, round(times.wall_secs(), 3)
    if outcome is not None:
        info["outcome"] = {
            "status": outcome.status,
            "phase": outcome.phase,
            "by": outcome.instance.describe(),
            "error": f"{outcome.error_type}: {outcome.message}" if not outcome.ok else None,
            "details": outcome.details,
        }
    participants = []
    directory = layout.participants_dir(key)
    for name in fsio.list_names(directory):
        if name.startswith(".") or not name.endswith(".json"):
            continue
        record, error = _read(Participant, directory / name)
        if record is None:
            if error:
                info["errors"].append(error)
            continue
        participants.append(
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
        )
    info["participants"] = sorted(participants, key=lambda p: p["joined_at"])
    return info


def render_runs(found: list[dict[str, Any]], limit: int | None = 3) -> str:
    if not found:
        return "coordination: no runs recorded (prepared with dj-elastic prepare, or never started)"
    shown = found if limit is None else found[:limit]
    lines = [f"coordination: {len(found)} run(s)" + (f", newest {len(shown)} shown" if len(shown) < len(found) else "")]
    for run in shown:
        outcome = run["outcome"]
        if outcome is None:
            state = "in progress" if run["prepared"] else "preparing"
        elif outcome["status"] == "ok":
            state = f"finalized by {outcome['by']}"
        else:
            state = f"FAILED in {outcome['phase']} ({outcome['by']}): {outcome['error']}"
        took = run.get("wall_secs")
        if took is not None:
            state += f" after {format_wall(took)}" if outcome is not None else f", {format_wall(took)} so far"
        lines.append(f"  run {run['run_id']} [{run['source']}] {state}")
        lines.append(
            f"    prepare leader: {run['prepare_leader'] or '-'}; finalize leader: {run['finalize_leader'] or '-'}"
        )
        nodes = sorted({p["node_id"] for p in run["participants"]})
        lines.append(f"    {len(run['participants'])} instance(s) on {len(nodes)} node(s): {', '.join(nodes) or '-'}")
        for error in run["errors"]:
            lines.append(f"    unreadable record: {error}")
    return "\n".join(lines)


# -- `dj-elastic status`: one snapshot, or a refreshing view ------------------------------------------------
def status_once(
    job_dir: Path,
    *,
    as_json: bool,
    show_all: bool,
    ttl_secs: float | None = None,
    observer: StalenessObserver | None = None,
    compact: bool = False,
) -> tuple[str, int]:
    """(the status text or JSON, the exit code: 0 complete, 1 incomplete, 2 terminal failures)."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    try:
        scanning = not fsio.exists(layout.manifest) and fsio.exists(layout.plan)
    except NotADirectoryError:
        raise not_a_directory(layout.root) from None
    if scanning:
        return _scanning(layout, as_json=as_json, compact=compact)
    # --all lists every shard with its details: the done markers are read (the job directory's way)
    snap = snapshot(job_dir, ttl_secs=ttl_secs, observer=observer, exact=False, use_summary=not show_all)
    coordination = runs(job_dir)
    if as_json:
        data = {**snapshot_json(snap), "coordination": coordination}
        # orjson: the 10,000-shard document takes ~0.8 s with the json module, ~0.05 s here
        text = orjson.dumps(data, option=0 if compact else orjson.OPT_INDENT_2).decode()
    else:
        text = render_text(snap, show_all=show_all) + "\n" + render_runs(coordination, limit=None if show_all else 3)
    if snap.terminal_failures:
        return text, EXIT_ERROR
    return text, EXIT_OK if snap.complete else EXIT_INCOMPLETE


def _scanning(layout: JobLayout, *, as_json: bool, compact: bool) -> tuple[str, int]:
    """Status of a job whose shards are still being scanned (no shard runs before every scan)."""
    plan = load_plan(layout.root)
    phase = read_scan_phase(layout, plan)
    code = EXIT_ERROR if phase.refused or phase.failed else EXIT_INCOMPLETE
    coordination = runs(layout.root)
    if as_json:
        data = {
            "format": FORMAT_PREFIX + "status",
            "version": VERSION,
            "job_dir": str(layout.root),
            "job_id": plan.job_id,
            "phase": "scanning",
            "complete": False,
            "scan": phase.to_json(),
            "coordination": coordination,
        }
        return orjson.dumps(data, option=0 if compact else orjson.OPT_INDENT_2).decode(), code
    lines = [
        f"job {layout.root} ({plan.job_id})",
        scan_text(phase),
        "scanning: no shard runs before every shard is scanned"
        + ("; the input was refused (dj-process and dj-elastic worker print the error)" if phase.refused else ""),
    ]
    return "\n".join(lines) + "\n" + render_runs(coordination, limit=3), code


def watch(job_dir: Path, *, interval: float, as_json: bool, show_all: bool, ttl_secs: float | None = None) -> int:
    """Refresh until the job is complete (or Ctrl-C); the exit code of the last snapshot.

    A watcher keeps one staleness observer across refreshes, so after watching for
    a lease TTL its RUNNING vs STALE follows the same rule a worker's takeover does.
    """
    if not interval > 0:
        raise ConfigError(f"invalid --watch interval {interval!r}: must be > 0 seconds", where="--watch")
    manifest = load_job(job_dir)  # the plan while the job is scanned
    ttl = float(manifest.settings.get("lease_ttl_secs") or 0) or None
    observer = StalenessObserver(ttl) if ttl else None
    in_place = sys.stdout.isatty() and not as_json
    code = EXIT_INCOMPLETE
    try:
        while True:
            text, code = status_once(
                job_dir, as_json=as_json, show_all=show_all, ttl_secs=ttl_secs, observer=observer, compact=True
            )
            if in_place:
                sys.stdout.write(_CLEAR + text + f"\n(refreshing every {interval:g}s; Ctrl-C to stop)\n")
            else:
                sys.stdout.write(text + "\n" + ("" if as_json else f"-- {time.strftime('%H:%M:%S')}\n"))
            sys.stdout.flush()
            if code == EXIT_OK:
                return code
            time.sleep(interval)
    except KeyboardInterrupt:
        return code


_CLEAR: Final = "\x1b[H\x1b[2J"  # cursor home, clear screen: redraw in place
