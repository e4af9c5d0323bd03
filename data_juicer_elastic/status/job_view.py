"""The job read once (:class:`JobView`: the snapshot, its numbers, runs and times; the pace records
read once for both the node tallies and the times), and ``dj-elastic status`` rendered from it:
the text, ``--json`` and ``--watch``."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from data_juicer_elastic.dedup.phase_progress import StageProgress, dedup_progress
from data_juicer_elastic.errors import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_OK, ConfigError, ElasticError, last_line
from data_juicer_elastic.jobdir.exports import CleanRecord
from data_juicer_elastic.jobdir.heartbeats import StalenessObserver
from data_juicer_elastic.jobdir.job_summary import read_paces
from data_juicer_elastic.jobdir.layout import JobLayout, not_a_directory
from data_juicer_elastic.jobdir.manifest import load_job, load_plan
from data_juicer_elastic.jobdir.records import FORMAT_PREFIX, VERSION, Manifest
from data_juicer_elastic.jobdir.shard_state import ShardState, ended_scans_error
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import attempt_started_at
from data_juicer_elastic.status.job_status import snapshot, snapshot_json
from data_juicer_elastic.status.job_times import JobTimes, format_wall, job_times, utc_stamp
from data_juicer_elastic.status.run_status import run_state, runs
from data_juicer_elastic.status.scan_phase import read_scan_phase, scan_text
from data_juicer_elastic.status.snapshot_types import JobSnapshot, JsonDict, ShardStatus
from data_juicer_elastic.status.throughput import Summary, rate, summarize

MAX_RECIPE_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True)
class JobView:
    snapshot: JobSnapshot
    throughput: Summary
    times: JobTimes | None  # None: neither a run record nor a plan time (a job split by an old prepare)
    runs: list[dict[str, Any]]  # newest first (run_status.runs)
    cleaned: CleanRecord | None = None  # the shard outputs were removed (dj-elastic clean)
    dedup: tuple[StageProgress, ...] = ()  # each deduplicator's phase (dedup.phase_progress)


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
    recipe = manifest.recipe if manifest is not None else _recipe(layout)
    dedup = tuple(dedup_progress(layout, recipe, sum(snap.counts.values()))) if recipe else ()
    return JobView(snap, summarize(snap), times, found, cleaned, dedup)


def _recipe(layout: JobLayout) -> dict[str, Any] | None:
    """The job's recipe (``recipe.json``, as the manifest holds it), for display; None when unreadable."""
    try:
        data = fsio.read_record(layout.recipe, MAX_RECIPE_BYTES)
        recipe = orjson.loads(data) if data is not None else None
    except (OSError, ValueError, ElasticError):
        return None
    return recipe if isinstance(recipe, dict) else None


def view_json(view: JobView, *, for_orjson: bool = False) -> JsonDict:
    """``dj-elastic status --json`` (``docs/status.md`` documents each field; ``for_orjson``:
    ``job_status.snapshot_json``)."""
    snap = view.snapshot
    data = snapshot_json(snap, view.throughput, for_orjson=for_orjson)
    data["times"] = view.times.to_json(now=snap.taken_at) if view.times is not None else None
    data["first_shard_secs"] = data["times"]["first_shard_secs"] if view.times is not None else None
    data["coordination"] = view.runs
    data["dedup"] = [stage.to_json() for stage in view.dedup]
    cleaned = view.cleaned
    data["cleaned"] = None if cleaned is None else {
        "at": cleaned.started_at, "export": cleaned.output_path, "layout": cleaned.layout,
        "complete": cleaned.complete, "bytes_freed": cleaned.bytes_freed,
    }  # fmt: skip
    return data


# -- `dj-elastic status`: one snapshot, or a refreshing view ------------------------------------------------
def status_document(
    job_dir: Path,
    *,
    as_json: bool,
    show_all: bool,
    ttl_secs: float | None = None,
    observer: StalenessObserver | None = None,
    compact: bool = False,
) -> tuple[str | bytes, int]:
    """(the status text or JSON, the exit code: 0 complete, 1 incomplete, 2 terminal failures); the
    JSON of a job with shards as orjson's UTF-8 bytes: the CLI writes them as they are (a
    100,000-shard document is 48 MB, which decoding and encoding again would copy twice)."""
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
    if view.dedup:
        text += "\n" + "\n".join(stage.text for stage in view.dedup)
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
            document, code = status_document(
                job_dir, as_json=as_json, show_all=show_all, ttl_secs=ttl_secs, observer=observer, compact=True
            )
            text = document.decode() if isinstance(document, bytes) else document
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


# -- the text of `dj-elastic status` ----------------------------------------------------------------------
MAX_LISTED: Final = 40  # shards listed without --all (the rest are counted)


def times_text(times: JobTimes, now: float, complete: bool = True) -> str:
    """``submitted 2026-12-01 20:06:56 UTC; first shard running after 6.1s, last done after 17.2s,
    finalized after 17.9s`` (durations as the closing summary and the report write them).  While
    shards are left (``complete`` False) the latest result is the last "so far", not the job's last."""
    parts = [f"submitted {utc_stamp(times.submitted_at)}"]
    first, last = times.first_shard_secs(), times.last_shard_secs()
    steps = [f"first shard running after {format_wall(first)}"] if first is not None else []
    last_done = "last shard done after" if complete else "last shard done so far after"
    steps += [f"{last_done} {format_wall(last)}"] if last is not None else []
    if times.finalized_at is not None:
        verb = "finalized" if times.ok else "aborted"
        steps.append(f"{verb} after {format_wall(times.wall_secs())}")
    else:
        steps.append(f"{format_wall(times.wall_secs(now))} so far")
    return "; ".join([parts[0], ", ".join(steps)])


def render_text(
    snap: JobSnapshot, show_all: bool = False, *, times: JobTimes | None = None, summary: Summary | None = None
) -> str:
    """``dj-elastic status``'s text (``times``: the job's, ``job_times``; ``summary``: the numbers
    of ``throughput``, computed here when not given)."""
    summary = summary or summarize(snap)
    counts = ", ".join(f"{state.value} {n}" for state, n in snap.counts.items())
    lines = [
        f"job {snap.job_dir} ({snap.job_id})",
        f"shards: {counts}" + (f" (retried {summary.retried})" if summary.retried else ""),
        f"rows: {snap.rows_done}/{snap.rows_total} input rows done"
        + (f" (+{summary.rows_in_progress} in progress)" if summary.rows_in_progress else "")
        + f", {snap.output_rows} output rows"
        + (f", {snap.quarantined_rows} quarantined" if snap.quarantined_rows else ""),
    ]
    if snap.summary is not None:
        age = max(0.0, snap.taken_at - snap.summary.written_at)
        since = "" if snap.complete else " (claims since then: the workers' pace records)"
        written = f"from the job summary written {format_wall(age)} ago{since}"
        lines.append(f"{written}; done shards' details not read (--all reads them)")
    if snap.scan is not None:
        lines.append(scan_text(snap.scan))
    if times is not None:
        lines.append(times_text(times, snap.taken_at, snap.complete))
    if snap.complete:
        lines.append("complete")
    else:
        eta = "unknown (no running attempt reports rows)"
        if summary.eta_secs is not None:
            eta = format_wall(summary.eta_secs)
        lines.append(f"throughput: {summary.rows_per_sec:.1f} rows/s now; ETA {eta}")
        lines.append("FAILED shards need `dj-elastic retry`" if snap.terminal_failures else "incomplete")
    batched = [s.batching for s in snap.shards if s.batching]
    if batched:
        lines.append(
            f"adaptive batching: {sum(b.get('ooms', 0) for b in batched)} OOM(s), "
            f"{sum(b.get('retries', 0) for b in batched)} retries in {len(batched)} shard(s); "
            f"{sum(b.get('terminal_ooms', 0) for b in batched)} unrecoverable"
        )
    quarantined = [s for s in snap.shards if s.quarantined]
    if quarantined:
        lines.append(
            f"quarantined: {snap.quarantined_rows} row(s) operators failed on, set aside in {len(quarantined)} "
            f"shard(s) (each row with its error: <export>_errors.jsonl after the merge; per shard: "
            f"{quarantined[0].errors_path}, ...); after fixing the operator or the rows: "
            f"dj-elastic retry --job-dir {snap.job_dir} --quarantined (it checks the fix and prints what to run next)"
        )
    if summary.nodes:
        width = max(8, *(len(n.node_id) for n in summary.nodes))
        lines.append(f"nodes:\n  {'node':<{width}}  running  rows/s now  shards done  rows done  output rows")
        for n in summary.nodes:
            row = f"  {n.node_id:<{width}}  {n.running:>7}  {n.rows_per_sec:>10.1f}"
            rows_done = "-" if n.rows_done is None else n.rows_done
            lines.append(row + f"  {n.shards_done:>11}  {rows_done:>9}  {n.output_rows:>11}")
    if summary.stragglers:
        lines.append("stragglers:")
        for s in summary.stragglers:
            if s.reason == "slow":
                why = f"slow: {s.rows_per_sec:.2f} rows/s vs median {s.median_rows_per_sec:.2f}"
            else:
                why = f"heartbeat late: last written {s.heartbeat_age_secs:.0f}s ago (mtime)"
            lines.append(f"  {s.shard_id} node={s.node_id} stage={s.stage} {why}")
    if summary.failed:
        lines.append("failed:")
        for f in summary.failed:
            lines.append(f"  {f.shard_id} ({f.failures} failure(s)): {f.error}")
            if f.log_path:
                lines.append(f"    log: {f.log_path}")
    shown = [s for s in snap.shards if show_all or _worth_listing(s)]
    if shown:
        lines.append("shards:" if show_all else "shards needing attention or running:")
    limit = None if show_all else MAX_LISTED
    for s in shown[:limit]:
        lines.append(_shard_line(s))
    if limit is not None and len(shown) > limit:
        lines.append(f"  ... {len(shown) - limit} more (--all lists every shard)")
    return "\n".join(lines)


def _worth_listing(s: ShardStatus) -> bool:
    """Without --all: everything but done shards and never-tried pending ones."""
    if s.state is ShardState.DONE:
        return bool(s.quarantined)
    return not (s.state is ShardState.PENDING and s.failures == 0 and not s.generation)


def _shard_line(s: ShardStatus) -> str:
    owner = f" node={s.owner_node}" if s.owner_node else ""
    extra = f" gen={_known(s.generation)}{owner} attempts={_known(s.attempts)} failures={_known(s.failures, '>0')}"
    if s.progress is not None and s.state in (ShardState.RUNNING, ShardState.STALE):
        p = s.progress
        r = rate(s)
        extra += f" stage={p.stage} read={p.rows_read}/{s.input_rows} written={p.rows_written}"
        extra += f" elapsed={format_wall(p.elapsed_secs)}" + (f" {r:.1f} rows/s" if r is not None else "")
    if s.heartbeat_age_secs is not None and s.state in (ShardState.RUNNING, ShardState.STALE):
        extra += f" heartbeat={s.heartbeat_age_secs:.0f}s ago"
    if s.state is ShardState.DONE and s.output_rows is not None:
        extra += f" rows={s.input_rows}->{s.output_rows}" + (f" quarantined={s.quarantined}" if s.quarantined else "")
    if s.batching:
        finals = ",".join(str(v.get("final_rows")) for v in (s.batching.get("stages") or {}).values())
        extra += f" ooms={s.batching.get('ooms', 0)} final_batch={finals}"
    if s.last_error and s.state is not ShardState.DONE:
        extra += f" last_error={last_line(s.last_error)!r}"
    return f"  {s.shard_id} {s.state.value:<7}{extra}"


def _known(value: int | None, unread: str = "?") -> str:
    """A count, or what is known of one the snapshot did not read (status from the job summary)."""
    return unread if value is None else str(value)


def render_runs(found: list[dict[str, Any]], limit: int | None = 3) -> str:
    if not found:
        return "coordination: no runs recorded (prepared with dj-elastic prepare, or never started)"
    shown = found if limit is None else found[:limit]
    lines = [f"coordination: {len(found)} run(s)" + (f", newest {len(shown)} shown" if len(shown) < len(found) else "")]
    for run in shown:
        outcome, state = run["outcome"], run_state(run)
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
