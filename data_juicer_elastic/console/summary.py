"""The lines a finished run ends with: rows in/out, shards, time, retries, and where everything is."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any

from data_juicer_elastic.console.quiet import say
from data_juicer_elastic.jobdir.exports import PART_STATS_SUFFIX, PARTS_INDEX, MergeRecord, export_stats_path
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest, load_plan
from data_juicer_elastic.shards.plan import added_inputs_note
from data_juicer_elastic.status.job_status import failure_records
from data_juicer_elastic.status.job_times import format_wall, job_times


def shown_path(path: str | os.PathLike) -> str:
    """A path as the user would type it here: relative when it lies below the working directory."""
    path = Path(path)
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def summary_lines(job_dir: str | os.PathLike, result: Any, elapsed_secs: float, log_path: str | None) -> list[str]:
    """``result``: a ``MergeResult``.  Reads the manifest and the failure records once."""
    manifest = load_manifest(Path(job_dir))
    retries = failure_records(job_dir)  # no read per shard that never failed
    errors = getattr(result, "quarantined", None)  # <export>_errors.jsonl: rows operators failed on
    lines = [
        f"done in {format_wall(elapsed_secs)}: {manifest.total_rows:,} rows in, {result.rows:,} rows out, "
        + (f"{errors.rows:,} rows quarantined, " if errors is not None else "")
        + f"{result.shards} shards, {retries} retr{'y' if retries == 1 else 'ies'}"
        + ("" if result.written else " (the export was already there, identical: left unchanged)"),
    ]
    for stage in getattr(result, "dedup", ()):  # the rows each deduplicator removed (merge.json)
        lines.append(
            f"  dedup   process[{stage['position']}] {stage['op']}: {stage['dropped']:,} of {stage['rows']:,} rows "
            "removed as duplicates"
            + (f", {stage['failed']:,} quarantined (their hashing failed)" if stage.get("failed") else "")
        )
    if errors is not None:
        lines.append(
            f"  errors  {shown_path(errors.path)} ({errors.rows:,} row{'s' if errors.rows != 1 else ''} operators "
            f"failed on, with why; after fixing the operator or the rows: dj-elastic retry --job-dir "
            f"{shlex.quote(shown_path(job_dir))} --quarantined, which checks the fix and prints what to run next)"
        )
    if getattr(result, "layout", "file") == "parts":  # a directory of parts in name order, an index, the stats
        export, shown = Path(result.output_path), shown_path(result.output_path) + os.sep
        lines.append(f"  output  {shown} ({result.shards} parts, in input order by name; index {PARTS_INDEX})")
        if any(export.glob(f"part-*{PART_STATS_SUFFIX}")):
            overall = f"{export.name}_overall_stats.csv"
            lines.append(f"  stats   {shown}part-*{PART_STATS_SUFFIX} (per row; overall: {overall} beside it)")
    else:
        lines.append(f"  output  {shown_path(result.output_path)}")
        stats = export_stats_path(Path(result.output_path))
        if stats.exists():
            overall = f"{stats.stem[: -len('_stats')]}_overall_stats.csv"
            lines.append(f"  stats   {shown_path(stats)} (per row; overall: {overall})")

    if note := added_inputs_note(manifest.dataset_path, manifest.inputs):  # files that came after the plan
        lines.append(f"  note    {note}")
    # a command to paste: a job_dir with spaces or quotes is quoted for the shell
    lines.append(f"  report  dj-elastic report --job-dir {shlex.quote(shown_path(job_dir))} --output report.html")
    if log_path:
        lines.append(f"  logs    {shown_path(log_path)}{os.sep}")
    return lines


def worker_done_line(job_dir: str | os.PathLike, summary: Any) -> str:
    """A worker's last line: what it did and, once the job is complete, who writes the export
    (workers publish shard results only) as a command to paste, or where it already is."""
    line = f"worker done ({summary.stop_reason}): {summary.done} shard(s) done here, {summary.failed} failed attempt(s)"
    if not summary.complete:
        return line
    merged = MergeRecord.read(JobLayout(Path(job_dir).resolve()).merge_record) if summary.done == 0 else None
    if merged is not None:  # nothing ran here: a merge of every result was published before
        where = shown_path(merged.output_path)
        return f"{line}; the job is complete and merged into {where} (dj-elastic verify checks it)"
    recorded = load_plan(Path(job_dir).resolve()).export_path  # the recipe's: merge's default output
    command = f"dj-elastic merge --job-dir {shlex.quote(shown_path(job_dir))}" + ("" if recorded else " --output PATH")
    where = f" into {shown_path(recorded)}" if recorded else ""
    how = f"`{command}` merges it{where} (so does a dj-process run of the recipe)"
    return f"{line}; the job is complete. Workers do not write the export: {how}"


def print_summary(job_dir: str | os.PathLike, result: Any, log_path: str | None = None) -> None:
    """The summary of a run: its wall time is the run's (``status.job_times``, as ``status`` and the
    report show it); a command without a run (a merge alone) counts from this process's start."""
    times = job_times(JobLayout(Path(job_dir)))
    elapsed = times.wall_secs() if times is not None else time.monotonic() - process_started()
    for line in summary_lines(job_dir, result, elapsed, log_path):
        say(line)


def process_started() -> float:
    """``time.monotonic()`` of this process's start (Linux ``/proc``; elsewhere: now), so the
    time reported includes the seconds of imports before the plugin got control."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            start_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        age = 0.0
    return time.monotonic() - max(age, 0.0)


def run_clock_start(job_dir: str | os.PathLike) -> float:
    """The ``time.monotonic()`` reading a live line's elapsed time counts from: the submission of
    the job's run while it runs (the clock the closing summary, ``status`` and the report use:
    ``status.job_times``), else this process's start.  Every display of the run takes it, so the
    plan, the scans, the shards and the merge show one clock, not one each."""
    try:
        times = job_times(JobLayout(Path(job_dir)), paces=[])  # the run's record alone: no listing of paces
    except Exception:  # noqa: BLE001 - display only: no readable run, this process's clock
        times = None
    if times is None or times.run_id is None or times.finalized_at is not None:
        return process_started()
    return time.monotonic() - max(0.0, time.time() - times.submitted_at)
