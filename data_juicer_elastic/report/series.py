"""Pure derivations from attempt facts: the time window, throughput bins, per-node summaries,
timeline lanes and the bounded activity strips drawn for very large jobs."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from data_juicer_elastic.status.job_history import AttemptFact, AttemptOutcome


@dataclass(frozen=True)
class Window:
    """The span the charts cover: first attempt start to the last end (or now, while running)."""

    t0: float
    t1: float

    @property
    def span(self) -> float:
        return self.t1 - self.t0


def window(attempts: Sequence[AttemptFact], now: float) -> Window | None:
    if not attempts:
        return None
    t0 = min(a.started_at for a in attempts)
    t1 = max(a.end_or(now) for a in attempts)
    return Window(t0, max(t1, t0 + 1.0))  # at least a second, so scales never divide by zero


def row_segments(attempt: AttemptFact) -> list[tuple[float, float, int]]:
    """(start, end, input rows) the attempt is credited with, for throughput over time.

    An accepted attempt read its whole shard: its input rows are spread evenly over
    its run.  A running attempt is credited with the rows its live progress record
    says it has read, one segment per interval between two progress samples.
    Failed, lost and discarded attempts add no useful rows.
    """
    if attempt.outcome is AttemptOutcome.DONE and attempt.ended_at is not None:
        return [(attempt.started_at, attempt.ended_at, attempt.input_rows)]
    if attempt.outcome is AttemptOutcome.RUNNING:
        out, when, rows = [], attempt.started_at, 0
        for t, read in attempt.progress:
            if t > when and read > rows:
                out.append((when, t, read - rows))
                when, rows = t, read
        return out
    return []


@dataclass(frozen=True)
class Throughput:
    edges: list[float]  # bins + 1 times
    total: list[float]  # rows/s per bin
    by_node: dict[str, list[float]]  # the busiest nodes, then "other (N nodes)"


def throughput(attempts: Sequence[AttemptFact], win: Window, bins: int = 120, max_series: int = 8) -> Throughput:
    width = win.span / bins
    edges = [win.t0 + i * width for i in range(bins + 1)]
    rows_by_node: dict[str, list[float]] = defaultdict(lambda: [0.0] * bins)
    for attempt in attempts:
        for start, end, rows in row_segments(attempt):
            _spread(rows_by_node[attempt.node_id], start, end, rows, win.t0, width, bins)
    ranked = sorted(rows_by_node, key=lambda n: (-sum(rows_by_node[n]), n))
    by_node = {node: [r / width for r in rows_by_node[node]] for node in ranked[:max_series]}
    rest = ranked[max_series:]
    if rest:
        by_node[f"other ({len(rest)} nodes)"] = [sum(rows_by_node[n][i] for n in rest) / width for i in range(bins)]
    total = [sum(rows_by_node[n][i] for n in ranked) / width for i in range(bins)]
    return Throughput(edges, total, by_node)


def _spread(target: list[float], start: float, end: float, rows: float, t0: float, width: float, bins: int) -> None:
    first = min(bins - 1, max(0, int((start - t0) / width)))
    if end <= start:
        target[first] += rows
        return
    last = min(bins - 1, max(0, int((end - t0) / width)))
    rate = rows / (end - start)
    for i in range(first, last + 1):
        lo, hi = max(start, t0 + i * width), min(end, t0 + (i + 1) * width)
        if hi > lo:
            target[i] += rate * (hi - lo)


def cumulative_done(attempts: Iterable[AttemptFact]) -> list[tuple[float, int]]:
    """(time, input rows done so far) at each accepted attempt's end."""
    ends = sorted(
        (a.ended_at, a.input_rows) for a in attempts if a.outcome is AttemptOutcome.DONE and a.ended_at is not None
    )
    out, total = [], 0
    for when, rows in ends:
        total += rows
        out.append((when, total))
    return out


@dataclass(frozen=True)
class NodeSummary:
    node_id: str
    attempts: int
    done: int
    failed: int
    lost: int
    running: int
    rows_done: int
    busy_secs: float
    first_start: float
    last_end: float

    @property
    def rows_per_sec(self) -> float | None:
        return self.rows_done / self.busy_secs if self.busy_secs > 0 and self.rows_done else None


def node_summaries(attempts: Sequence[AttemptFact], now: float) -> list[NodeSummary]:
    grouped: dict[str, list[AttemptFact]] = defaultdict(list)
    for attempt in attempts:
        grouped[attempt.node_id].append(attempt)
    out = []
    for node, mine in sorted(grouped.items()):
        done = [a for a in mine if a.outcome is AttemptOutcome.DONE]
        out.append(
            NodeSummary(
                node_id=node,
                attempts=len(mine),
                done=len(done),
                failed=sum(a.outcome is AttemptOutcome.FAILED for a in mine),
                lost=sum(a.outcome is AttemptOutcome.LOST for a in mine),
                running=sum(a.outcome is AttemptOutcome.RUNNING for a in mine),
                rows_done=sum(a.input_rows for a in done),
                busy_secs=sum(a.ended_at - a.started_at for a in done if a.ended_at is not None),
                first_start=min(a.started_at for a in mine),
                last_end=max(a.end_or(now) for a in mine),
            )
        )
    return out


def pack_lanes(intervals: Sequence[tuple[float, float]], max_lanes: int) -> tuple[list[int], int]:
    """Greedy interval packing: a lane per concurrent attempt on a node (slots), at most ``max_lanes``
    (beyond that bars share the last lane).  Returns (lane per interval, lanes used)."""
    order = sorted(range(len(intervals)), key=lambda i: intervals[i])
    lane_end: list[float] = []
    lanes = [0] * len(intervals)
    for i in order:
        start, end = intervals[i]
        lane = next((k for k, free in enumerate(lane_end) if free <= start), None)
        if lane is None:
            if len(lane_end) < max_lanes:
                lane_end.append(end)
                lane = len(lane_end) - 1
            else:
                lane = max_lanes - 1
        lane_end[lane] = max(lane_end[lane], end)
        lanes[i] = lane
    return lanes, max(1, len(lane_end))


@dataclass(frozen=True)
class Activity:
    """One node's attempts folded into time buckets (for jobs with too many attempts to draw one by one)."""

    concurrency: list[float]  # mean attempts running per bucket
    finished: list[int]  # accepted attempts ending in each bucket
    failed: list[int]  # failed or lost attempts ending in each bucket


def activity(attempts: Iterable[AttemptFact], win: Window, buckets: int, now: float) -> Activity:
    width = win.span / buckets
    busy = [0.0] * buckets
    finished, failed = [0] * buckets, [0] * buckets
    for attempt in attempts:
        end = attempt.end_or(now)
        _spread(busy, attempt.started_at, end, end - attempt.started_at, win.t0, width, buckets)
        index = min(buckets - 1, max(0, int((end - win.t0) / width)))
        if attempt.outcome is AttemptOutcome.DONE:
            finished[index] += 1
        elif attempt.outcome in (AttemptOutcome.FAILED, AttemptOutcome.LOST):
            failed[index] += 1
    return Activity([b / width for b in busy], finished, failed)


def quantize(values: Sequence[float], top: float, levels: int) -> list[int]:
    """0 for nothing, else 1..levels proportional to ``value / top``."""
    if top <= 0:
        return [0] * len(values)
    return [0 if v <= 0 else max(1, min(levels, math.ceil(levels * v / top))) for v in values]


def runs_of(values: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first index, last index, value) of each run of equal values."""
    out: list[tuple[int, int, int]] = []
    for i, value in enumerate(values):
        if out and out[-1][2] == value:
            out[-1] = (out[-1][0], i, value)
        else:
            out.append((i, i, value))
    return out
