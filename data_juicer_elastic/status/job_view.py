"""One read of a job, and ``dj-elastic status`` (once or ``--watch``) rendered from it.

A :class:`JobView` is the job read once: its per-shard snapshot (``job_status``, from the job
summary or the job directory), the numbers computed from it (``throughput``: rows per second,
the ETA, nodes, stragglers), its runs (``run_status``) and its times (``job_times``: submitted,
first shard running, last shard done, finalized).  The pace records are read once for both the
snapshot's node tallies and the times.  Every surface takes its durations from
:class:`~data_juicer_elastic.status.job_times.JobTimes`, so the closing summary, ``status`` and
the report say the same to the second.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from data_juicer_elastic.errors import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_OK, ConfigError
from data_juicer_elastic.jobdir.exports import CleanRecord
from data_juicer_elastic.jobdir.heartbeats import StalenessObserver
from data_juicer_elastic.jobdir.job_summary import read_paces
from data_juicer_elastic.jobdir.layout import JobLayout, not_a_directory
from data_juicer_elastic.jobdir.manifest import load_job, load_plan
from data_juicer_elastic.jobdir.records import FORMAT_PREFIX, VERSION, Manifest
from data_juicer_elastic.jobdir.shard_state import ended_scans_error
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import attempt_started_at
from data_juicer_elastic.status.job_status import snapshot, snapshot_json
from data_juicer_elastic.status.job_times import JobTimes, job_times
from data_juicer_elastic.status.run_status import render_runs, runs
from data_juicer_elastic.status.scan_phase import read_scan_phase, scan_text
from data_juicer_elastic.status.snapshot_types import JobSnapshot, JsonDict
from data_juicer_elastic.status.status_text import render_text
from data_juicer_elastic.status.throughput import Summary, summarize


@dataclass(frozen=True)
class JobView:
    snapshot: JobSnapshot
    throughput: Summary
    times: JobTimes | None  # None: neither a run record nor a plan time (a job split by an old prepare)
    runs: list[dict[str, Any]]  # newest first (run_status.runs)
    cleaned: CleanRecord | None = None  # the shard outputs were removed (dj-elastic clean)


def read_view(
    job_dir: str | Path,
    *,
    use_summary: bool = True,
    ttl_secs: float | None = None,
    observer: StalenessObserver | None = None,
    now: float | None = None,
    manifest: Manifest | None = None,
) -> JobView:
    """The job as ``dj-elastic status`` shows it (``use_summary=False``: ``--all``, every record;
    ``now``: the wall clock heartbeat ages count to; ``manifest``: the job's, if loaded already)."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    paces = read_paces(layout)
    snap = snapshot(
        layout.root, ttl_secs, observer, exact=False, use_summary=use_summary, paces=paces, now=now, manifest=manifest
    )
    starts = (t for s in snap.shards if s.attempt_id and (t := attempt_started_at(s.attempt_id)) is not None)
    planned = snap.scan.planned_at if snap.scan is not None else None
    found = runs(layout.root)
    times = job_times(
        layout, planned_at=planned, paces=paces, attempt_starts=starts, runs=found, complete=snap.complete
    )
    cleaned, _ = CleanRecord.read_or_error(layout.clean_record)  # display: a corrupt one is verify's to name
    return JobView(snap, summarize(snap), times, found, cleaned)


def view_json(view: JobView, *, for_orjson: bool = False) -> JsonDict:
    """``dj-elastic status --json`` (``docs/status.md`` documents each field; ``for_orjson``:
    ``job_status.snapshot_json``)."""
    snap = view.snapshot
    data = snapshot_json(snap, view.throughput, for_orjson=for_orjson)
    data["times"] = view.times.to_json(now=snap.taken_at) if view.times is not None else None
    data["first_shard_secs"] = data["times"]["first_shard_secs"] if view.times is not None else None
    data["coordination"] = view.runs
    cleaned = view.cleaned
    data["cleaned"] = None if cleaned is None else {
        "at": cleaned.started_at, "export": cleaned.output_path, "layout": cleaned.layout,
        "complete": cleaned.complete, "bytes_freed": cleaned.bytes_freed,
    }  # fmt: skip
    return data


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
    text, code = status_document(
        job_dir, as_json=as_json, show_all=show_all, ttl_secs=ttl_secs, observer=observer, compact=compact
    )
    return text.decode() if isinstance(text, bytes) else text, code


def status_document(
    job_dir: Path,
    *,
    as_json: bool,
    show_all: bool,
    ttl_secs: float | None = None,
    observer: StalenessObserver | None = None,
    compact: bool = False,
) -> tuple[str | bytes, int]:
    """:func:`status_once` with the JSON of a job with shards as orjson's UTF-8 bytes: the CLI writes
    them as they are (a 100,000-shard document is 48 MB, which decoding and encoding again would
    copy twice)."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    try:
        scanning = not fsio.exists(layout.manifest) and fsio.exists(layout.plan)
    except NotADirectoryError:
        raise not_a_directory(layout.root) from None
    if scanning:
        return _scanning(layout, as_json=as_json, compact=compact)
    # --all lists every shard with its details: the done markers are read (the job directory's way)
    view = read_view(job_dir, use_summary=not show_all, ttl_secs=ttl_secs, observer=observer)
    snap = view.snapshot
    if as_json:
        # orjson: the 10,000-shard document takes ~0.8 s with the json module, ~0.05 s here
        text: str | bytes = orjson.dumps(view_json(view, for_orjson=True), option=0 if compact else orjson.OPT_INDENT_2)
    else:
        text = _text(view, show_all=show_all)
    if snap.terminal_failures:
        return text, EXIT_ERROR
    return text, EXIT_OK if snap.complete else EXIT_INCOMPLETE


def print_document(text: str | bytes) -> None:
    """Print :func:`status_document`'s text, or write its JSON bytes as they are, with a newline."""
    if isinstance(text, str):
        print(text)
        return
    sys.stdout.flush()
    sys.stdout.buffer.write(text)
    sys.stdout.buffer.write(b"\n")
    sys.stdout.buffer.flush()


def _text(view: JobView, *, show_all: bool) -> str:
    text = render_text(view.snapshot, show_all=show_all, times=view.times, summary=view.throughput)
    if (cleaned := view.cleaned) is not None:
        state = f"{cleaned.bytes_freed:,} bytes freed" if cleaned.complete else "stopped: run it again"
        text += f"\ncleaned: the shard outputs were removed ({state}); the export {cleaned.output_path} is the output"
    return text + "\n" + render_runs(view.runs, limit=None if show_all else 3)


def _scanning(layout: JobLayout, *, as_json: bool, compact: bool) -> tuple[str, int]:
    """Status of a job whose shards are still being scanned (no shard runs before every scan)."""
    plan = load_plan(layout.root)
    phase = read_scan_phase(layout, plan)
    code = EXIT_ERROR if phase.refused or phase.failed else EXIT_INCOMPLETE
    # once every scan has ended, the refusal itself (file:line, what is wrong), as verify and report say it
    ended = ended_scans_error(layout, plan) if phase.refused or phase.failed else None
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
            "error": None if ended is None else str(ended),
            "coordination": coordination,
        }
        return orjson.dumps(data, option=0 if compact else orjson.OPT_INDENT_2).decode(), code
    lines = [
        f"job {layout.root} ({plan.job_id})",
        scan_text(phase),
        "scanning: no shard runs before every shard is scanned" + ("; the input was refused" if phase.refused else ""),
        *([f"error: {ended}"] if ended is not None else []),
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
