"""Rates, ETA, per-node throughput, stragglers and failures from one status snapshot.

Pure functions of a snapshot: no file is read here.  An attempt's rate is ``rows_read /
elapsed_secs`` of its progress record (both by the writer's monotonic clock, so no two clocks are
mixed); the job's rows/s is the sum over running attempts (the throughput now, not a lifetime
average).  Each number's definition: ``docs/status.md``, the ``--json`` schema.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from data_juicer_elastic.errors import last_line
from data_juicer_elastic.jobdir.shard_state import ShardState
from data_juicer_elastic.status.snapshot_types import JobSnapshot, ShardStatus

STRAGGLER_RATIO: Final = 0.25
MIN_PEERS: Final = 3
MIN_ELAPSED_SECS: Final = 30.0
LATE_BEATS: Final = 3.0
_LIVE: Final = (ShardState.RUNNING, ShardState.STALE)


@dataclass(frozen=True)
class NodeThroughput:
    node_id: str
    running: int  # attempts running on the node now
    rows_per_sec: float  # sum of the rates of its running attempts
    shards_done: int  # accepted results published by the node
    rows_done: int  # input rows of those shards (from the summary: the workers' pace records)
    output_rows: int  # output rows of those shards


# Why a running shard is called a straggler: far below the median rate, or its heartbeat late.
StragglerReason = Literal["slow", "heartbeat-late"]


@dataclass(frozen=True)
class Straggler:
    shard_id: str
    node_id: str | None
    reason: StragglerReason
    rows_per_sec: float | None
    median_rows_per_sec: float | None
    heartbeat_age_secs: float | None
    stage: str | None


@dataclass(frozen=True)
class FailedShard:
    shard_id: str
    error: str  # the last line of the last error
    failures: int
    log_path: str | None


@dataclass(frozen=True)
class Summary:
    rows_in_progress: int  # rows read so far by running attempts
    rows_per_sec: float  # the job's throughput now (running attempts)
    eta_secs: float | None  # None: no running attempt with a rate, or nothing can progress
    retried: int  # shards not terminally failed that have failed at least once
    nodes: list[NodeThroughput] = field(default_factory=list)
    stragglers: list[Straggler] = field(default_factory=list)
    failed: list[FailedShard] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "rows_in_progress": self.rows_in_progress,
            "rows_per_sec": round(self.rows_per_sec, 3),
            "eta_secs": None if self.eta_secs is None else round(self.eta_secs, 1),
            "retried": self.retried,
            "nodes": [asdict(n) for n in self.nodes],
            "stragglers": [asdict(s) for s in self.stragglers],
            "failed": [asdict(f) for f in self.failed],
        }


def rate(shard: ShardStatus, node_rates: dict[str, float] | None = None) -> float | None:
    """Rows read per second of the shard's running attempt, by its own clock.  Before it reports a
    row (its first rows are counted once a block of them is through the first operator, seconds into
    a shard), the rate of its node's accepted attempts (``node_rates``, when known): a shard that
    has just started is working, not stopped."""
    record = shard.progress
    if shard.state not in _LIVE:
        return None
    if (record is None or record.rows_read <= 0) and node_rates and shard.owner_node in node_rates:
        return node_rates[shard.owner_node]
    if record is None or record.elapsed_secs <= 0:
        return None
    return min(record.rows_read, shard.input_rows) / record.elapsed_secs


def eta_secs(rows_left: float, rows_per_sec: float | None) -> float | None:
    """The one ETA rule (``status``, the report and the console's plain line): the rows left at the
    rate now; None until a rate is known."""
    if rows_left <= 0:
        return 0.0
    return rows_left / rows_per_sec if rows_per_sec else None


def summarize(snap: JobSnapshot) -> Summary:
    groups = snap.by_state
    running, failed = groups[ShardState.RUNNING], groups[ShardState.FAILED]
    # running and stale shards in manifest order (the stragglers' order)
    live = [s for s in snap.shards if s.state in _LIVE] if groups[ShardState.STALE] else list(running)
    node_rates = {t.node_id: r for t in snap.node_tallies or () if (r := t.attempt_rows_per_sec) is not None}
    rates = {s.shard_id: rate(s, node_rates) for s in live}
    in_progress = sum(min(s.progress.rows_read, s.input_rows) for s in live if s.progress is not None)
    job_rate = sum(r for s in running if (r := rates[s.shard_id]) is not None)
    failed_rows = sum(s.input_rows for s in failed)
    remaining = max(0, snap.rows_total - snap.rows_done - in_progress - failed_rows)
    if remaining == 0 and not any(groups[state] for state in (ShardState.PENDING, *_LIVE)):
        eta = 0.0 if snap.complete else None
    else:
        eta = eta_secs(remaining, job_rate)
    return Summary(
        rows_in_progress=in_progress,
        rows_per_sec=job_rate,
        eta_secs=eta,
        # failures None: some, not counted (inline: a call per shard is a tenth of a 100,000-shard status's numbers)
        retried=sum(
            1 for s in snap.shards if (s.failures is None or s.failures > 0) and s.state is not ShardState.FAILED
        ),
        nodes=_nodes(snap, rates),
        stragglers=_stragglers(live, rates, snap.heartbeat_secs),
        failed=[FailedShard(s.shard_id, last_line(s.last_error), s.failures, s.log_path) for s in failed],
    )


def _nodes(snap: JobSnapshot, rates: dict[str, float | None]) -> list[NodeThroughput]:
    running: dict[str, int] = defaultdict(int)
    speed: dict[str, float] = defaultdict(float)
    done: dict[str, int] = defaultdict(int)
    rows: dict[str, int] = defaultdict(int)
    out: dict[str, int] = defaultdict(int)
    # the running shards, then the done ones (what is added up per node is the same in any order)
    for s in snap.by_state[ShardState.RUNNING] + snap.by_state[ShardState.DONE]:
        if s.owner_node is None:
            continue
        if s.state is ShardState.RUNNING:
            running[s.owner_node] += 1
            speed[s.owner_node] += rates.get(s.shard_id) or 0.0
        elif s.state is ShardState.DONE:
            done[s.owner_node] += 1
            rows[s.owner_node] += s.input_rows
            out[s.owner_node] += s.output_rows or 0
    if snap.node_tallies is not None:  # from the summary: the workers' own counts (no done marker read)
        done = defaultdict(int, {t.node_id: t.shards_done for t in snap.node_tallies if t.shards_done})
        out = defaultdict(int, {t.node_id: t.output_rows for t in snap.node_tallies})
        rows = defaultdict(int, {t.node_id: t.rows_done for t in snap.node_tallies})
    names = sorted(set(running) | set(done))
    return [NodeThroughput(n, running[n], round(speed[n], 3), done[n], rows[n], out[n]) for n in names]


def _stragglers(live: list[ShardStatus], rates: dict[str, float | None], heartbeat_secs: float | None):
    settled = [
        r for s in live if s.progress is not None and s.progress.elapsed_secs >= MIN_ELAPSED_SECS
        if (r := rates[s.shard_id]) is not None
    ]  # fmt: skip
    median = statistics.median(settled) if len(settled) >= MIN_PEERS else None
    found = []
    for s in live:
        r = rates[s.shard_id]
        stage = s.progress.stage if s.progress is not None else None
        age = s.heartbeat_age_secs
        late = bool(heartbeat_secs) and age is not None and age > LATE_BEATS * heartbeat_secs
        if late:
            found.append(Straggler(s.shard_id, s.owner_node, "heartbeat-late", r, median, s.heartbeat_age_secs, stage))
        elif (
            median is not None
            and r is not None
            and s.progress.elapsed_secs >= MIN_ELAPSED_SECS
            and r < STRAGGLER_RATIO * median
        ):
            found.append(Straggler(s.shard_id, s.owner_node, "slow", r, median, s.heartbeat_age_secs, stage))
    return found
