"""The human-readable ``dj-elastic status``: summary, per-node table, stragglers, failures, shards."""

from __future__ import annotations

import time
from typing import Final

from data_juicer_elastic.errors import last_line
from data_juicer_elastic.jobdir.shard_state import ShardState
from data_juicer_elastic.status.job_times import JobTimes, format_wall
from data_juicer_elastic.status.scan_phase import scan_text
from data_juicer_elastic.status.snapshot_types import JobSnapshot, ShardStatus
from data_juicer_elastic.status.throughput import Summary, rate, summarize

MAX_LISTED: Final = 40  # shards listed without --all (the rest are counted)


def times_text(times: JobTimes, now: float, complete: bool = True) -> str:
    """``submitted 2026-12-01 20:06:56 UTC; first shard running after 6.1s, last done after 17.2s,
    finalized after 17.9s`` (durations as the closing summary and the report write them).  While
    shards are left (``complete`` False) the latest result is the last "so far", not the job's last."""
    parts = [f"submitted {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(times.submitted_at))}"]
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
