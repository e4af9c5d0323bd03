"""Straggler avoidance: a slow node does not take one of the last shards from faster ones (the
rule, and why it never leaves a shard unclaimed: docs/multinode.md, "Slow nodes and the last shards").
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from loguru import logger

from data_juicer_elastic.jobdir import attempts, task_queue
from data_juicer_elastic.jobdir.job_summary import view_of
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import AttemptRecord, Manifest
from data_juicer_elastic.sharedfs import fsio

MAX_NEW_SPANS: Final = 16  # done shards whose durations one observe() reads at most (a sample)
EXPECTED_REMAINING: Final = 0.5  # a running worker is, on average, half-way through its shard


def should_claim(my_secs: float | None, others_secs: list[float], pending: int) -> bool:
    """The gate's rule, pure (docs/multinode.md, "Slow nodes and the last shards")."""
    if my_secs is None or my_secs <= 0 or pending <= 0:
        return True
    capacity = sum(math.floor(my_secs / d - EXPECTED_REMAINING) for d in others_secs if d > 0)
    return pending > capacity


@dataclass(frozen=True)
class JobPace:
    """What :func:`observe` read: each node's shard time, the running claims, the pending count."""

    secs_by_node: dict[str, float]
    first_secs_by_node: dict[str, float]  # nodes with one accepted attempt: its duration (Ray start included)
    running: list[tuple[str, int]]  # (node_id, pid) of live claims
    pending: int


# A done shard's (node, start, end), or None when its attempt record gave no duration.
DoneSpans = dict[str, tuple[str, float, float] | None]


@dataclass
class _Listings:
    """One listing of ``claims/`` and one of ``done/``, and the done spans sampled with them."""

    claimed: set[str]
    done: set[str]


def _list_and_sample(layout: JobLayout, manifest: Manifest, done_spans: DoneSpans) -> _Listings:
    listings = _Listings(set(fsio.list_names(layout.claims_dir)), set(attempts.list_done(layout)))
    new_done = [e.shard_id for e in manifest.shards if e.shard_id in listings.done and e.shard_id not in done_spans]
    if len(new_done) > MAX_NEW_SPANS:
        new_done = random.sample(new_done, MAX_NEW_SPANS)
    for shard in new_done:
        result, _ = attempts.read_done(layout, shard)
        if result is not None:
            done_spans[shard] = _span(layout, shard, result.attempt_id, result.node_id)
    return listings


def _pace(done_spans: DoneSpans) -> tuple[dict[str, float], dict[str, float]]:
    """(mean warm shard secs by node, the same for nodes with a single known attempt)."""
    durations: dict[str, list[tuple[float, float]]] = {}
    for span in done_spans.values():
        if span is not None:
            durations.setdefault(span[0], []).append(span[1:])
    secs, first = {}, {}
    for node, spans in durations.items():
        spans.sort()
        warm = spans[1:] or spans  # the first attempt includes the node's Ray start
        secs[node] = statistics.mean(end - start for start, end in warm)
        if len(spans) == 1:
            first[node] = secs[node]
    return secs, first


def observe(
    layout: JobLayout,
    manifest: Manifest,
    done_spans: DoneSpans | None = None,
    listings: _Listings | None = None,
) -> JobPace:
    """One read of the job's pace in O(live claims + ``MAX_NEW_SPANS``) operations, not O(shards).
    ``done_spans`` caches done shards across calls (each record is read once); at most
    ``MAX_NEW_SPANS`` unseen ones (a uniform sample) are read per call.  A shard not in the
    ``claims/`` listing is pending: a lagging listing can only make the gate say yes (safe)."""
    done_spans = {} if done_spans is None else done_spans
    if listings is None:
        listings = _list_and_sample(layout, manifest, done_spans)
    running: list[tuple[str, int]] = []
    pending = 0
    for entry in manifest.shards:
        shard = entry.shard_id
        if shard in done_spans or shard in listings.done:
            continue  # done (its duration read, or not sampled yet)
        if shard not in listings.claimed:
            pending += 1
            continue
        result, error = attempts.read_done(layout, shard)  # done since the listing, or not done
        if result is not None:
            done_spans[shard] = _span(layout, shard, result.attempt_id, result.node_id)
            continue
        if error is not None or fsio.exists(layout.failed(shard)):
            continue
        view = task_queue.read_lease(layout, shard)
        if view.generation == 0 or view.ended or view.claim is None:
            pending += 1
        else:
            running.append((view.claim.node_id, view.claim.pid))
    secs, first = _pace(done_spans)
    return JobPace(secs, first, running, pending)


def _span(layout: JobLayout, shard_id: str, attempt_id: str, node_id: str) -> tuple[str, float, float] | None:
    try:
        record = AttemptRecord.read(layout.attempt_record(shard_id, attempt_id))
    except Exception:  # noqa: BLE001 - informational: a missing or odd record only weakens the estimate
        return None
    ok = record is not None and record.ended_at is not None
    return (node_id, record.started_at, record.ended_at) if ok else None


class ClaimGate:
    """``gate()`` -> may this worker claim now?  Reads the job at most once per ``min_interval``."""

    def __init__(
        self,
        layout: JobLayout,
        manifest: Manifest,
        node_id: str,
        pid: int,
        *,
        min_interval: float = 1.0,
        max_read_share: float | None = 0.1,
        startup_secs: Callable[[], float | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.layout, self.manifest, self.node_id, self.pid = layout, manifest, node_id, pid
        self.startup_secs = startup_secs  # this worker's Ray start, inside its first attempt
        self.min_interval, self.clock = min_interval, clock
        self.max_read_share = max_read_share  # at most this share of the worker's time spent reading
        self._last: tuple[float, bool] | None = None
        self._interval = min_interval
        self._declined = False
        self._done_spans: DoneSpans = {}

    def __call__(self) -> bool:
        if self._last is not None and self.clock() - self._last[0] < self._interval:
            return self._last[1]
        started = self.clock()
        view = view_of(self.layout, self.manifest)
        if view is not None:  # the summary has every node's pace and the live claims: no reads of our own
            nodes, counts = view.nodes, view.counts()
            secs = {n.node_id: n.secs_per_shard for n in nodes if n.secs_per_shard is not None}
            first = {n.node_id: n.first_secs for n in nodes if n.first_secs is not None}
            live = [(claim.node_id, claim.pid) for claim in view.live.values() if not claim.stale]
            return self._answer(self._decide(secs, first, live, counts["pending"] + counts["stale"]), started)
        listings = _list_and_sample(self.layout, self.manifest, self._done_spans)
        valid_for = self._cannot_decline_for(listings)
        if valid_for is not None:
            return self._answer(True, started, valid_for)
        pace = observe(self.layout, self.manifest, self._done_spans, listings=listings)
        allowed = self._decide(pace.secs_by_node, pace.first_secs_by_node, pace.running, pace.pending)
        return self._answer(allowed, started)

    def _decide(
        self, secs: dict[str, float], first: dict[str, float], running: list[tuple[str, int]], pending: int
    ) -> bool:
        """:func:`should_claim` with each node's pace and the (node, pid) of the live claims."""
        mine = self._mine(secs, first)
        others = [secs[node] for node, pid in running if (node, pid) != (self.node_id, self.pid) and node in secs]
        allowed = should_claim(mine, others, pending)
        if not allowed and not self._declined:
            logger.info(
                f"not claiming: {len(others)} running worker(s) finish the {pending} pending shard(s) "
                f"sooner than this node's {mine:.1f}s per shard"
            )
        return allowed

    def _mine(self, secs: dict[str, float], first: dict[str, float]) -> float | None:
        mine = secs.get(self.node_id)
        if self.node_id in first and mine is not None:
            mine = max(mine - (self.startup_secs() or 0.0), 0.0) or None
        return mine

    def _cannot_decline_for(self, listings: _Listings) -> float | None:
        """Seconds for which :func:`should_claim` must say yes, judged from the two listings alone,
        or None when the leases must be read.  At least the never-claimed shards are pending, and at
        most every claimed, not done shard is a running worker as fast as the fastest node known;
        the margin cannot be used up before that many claims were made, each needing a shard time.
        Outside the tail this spares reading every live claim's lease, and the listings too."""
        secs, first = _pace(self._done_spans)
        mine = self._mine(secs, first)
        speeds = [d for d in secs.values() if d > 0]
        if mine is None or not speeds:
            return 0.0
        ids = set(self.manifest.shard_ids)
        claimed = listings.claimed & ids
        pending_at_least = len(ids) - len(claimed)
        running_at_most = len(claimed - listings.done)
        per_worker_at_most = max(0, math.floor(mine / min(speeds) - EXPECTED_REMAINING))
        margin = pending_at_least - running_at_most * per_worker_at_most
        if margin <= 0:
            return None
        return 0.5 * (margin - 1) / (running_at_most + 1) * min(speeds)  # half of it, to be safe

    def _answer(self, allowed: bool, started: float, valid_for: float = 0.0) -> bool:
        self._declined = not allowed
        # Stamp the answer when the read ENDS, and reuse it long enough that reading is at
        # most ``max_read_share`` of this worker's time: on a slow NAS or a huge job dir
        # the gate must not re-read the whole job before every claim.
        finished = self.clock()
        self._interval = max(self.min_interval, valid_for)
        if self.max_read_share:
            self._interval = max(self._interval, (finished - started) / self.max_read_share)
        self._last = (finished, allowed)
        return allowed
