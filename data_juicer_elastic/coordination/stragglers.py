"""Straggler avoidance: a slow node does not take one of the last shards from faster ones.

Dynamic claiming already gives fast nodes more shards; what it cannot avoid is the
tail: a node 4x slower that claims one of the last shards finishes long after
everyone else.  Before claiming, a worker asks :class:`ClaimGate`.  With

    d_me   this node's time per shard (mean of its accepted attempts)
    d_j    the time per shard of each worker j that holds a live claim right now
    P      pending shards (nobody holds them), the one to claim included

worker j, expected to be half-way through its current shard, can finish
``floor(d_me / d_j - 1/2)`` more shards in the time this node needs for one; the
node declines while those capacities add up to at least ``P``: the others would
finish every pending shard before it could finish one.  Equal speeds never
decline; a 4x slower node leaves the last few shards to fast ones.

The inputs come from the job summary (``jobdir.job_summary``: each node's pace from the
workers' pace records, the live claims, the pending count) when there is a fresh one, without
a read of the gate's own; else from listings and the leases of live claims (:func:`observe`).

Safety: only workers holding a live claim count, so once the others stop
(finished, capped, dead) the gate opens and no shard is left unclaimed; a node
with no accepted attempt yet always claims.  A node's first attempt includes its
Ray start: it is left out when the node has others, and for this node's own
estimate the measured start time is subtracted.  Durations are one node's own
clock (its attempts' start and end), never compared across nodes.
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

from data_juicer_elastic.jobdir import attempts, job_summary, leases
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import Manifest
from data_juicer_elastic.jobdir.result_records import AttemptRecord
from data_juicer_elastic.sharedfs import fsio

MAX_NEW_SPANS: Final = 16  # done shards whose durations one observe() reads at most (a sample)
EXPECTED_REMAINING: Final = 0.5  # a running worker is, on average, half-way through its shard


def should_claim(my_secs: float | None, others_secs: list[float], pending: int) -> bool:
    """Pure policy (see the module docstring)."""
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


def _list_and_sample(
    layout: JobLayout, manifest: Manifest, done_spans: DoneSpans, max_new_spans: int | None, rng
) -> _Listings:
    listings = _Listings(set(fsio.list_names(layout.claims_dir)), set(attempts.list_done(layout)))
    new_done = [e.shard_id for e in manifest.shards if e.shard_id in listings.done and e.shard_id not in done_spans]
    if max_new_spans is not None and len(new_done) > max_new_spans:
        new_done = (rng or random).sample(new_done, max_new_spans)
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
    *,
    max_new_spans: int | None = MAX_NEW_SPANS,
    rng: random.Random | None = None,
    listings: _Listings | None = None,
) -> JobPace:
    """One read of the job's pace in O(live claims + ``max_new_spans``) operations, not O(shards).

    ``done_spans`` caches done shards across calls: DONE is terminal, so each done marker
    and attempt record is read once, not on every call.  One listing of ``claims/`` and one
    of ``done/`` replace a read per shard: a shard not in ``claims/`` was never claimed, so
    it is pending; a listed done shard is done.  Listings may lag on NFS; a just-claimed
    shard then counts as pending, which can only make the gate say yes (the safe answer).
    At most ``max_new_spans`` done shards not seen before (a uniform sample) have their
    durations read per call, so a worker joining a job with 50k done shards does not read
    100k records before its first claim; the cache fills over later calls.
    """
    done_spans = {} if done_spans is None else done_spans
    if listings is None:
        listings = _list_and_sample(layout, manifest, done_spans, max_new_spans, rng)
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
        view = leases.read_lease(layout, shard)
        if view.generation == 0 or view.ended or view.claim is None:
            pending += 1
        else:
            running.append((view.claim.node_id, view.claim.pid))
    secs, first = _pace(done_spans)
    return JobPace(secs, first, running, pending)


def _span(layout: JobLayout, shard_id: str, attempt_id: str, node_id: str) -> tuple[str, float, float] | None:
    record = _attempt(layout, shard_id, attempt_id)
    ok = record is not None and record.ended_at is not None
    return (node_id, record.started_at, record.ended_at) if ok else None


def _attempt(layout: JobLayout, shard_id: str, attempt_id: str) -> AttemptRecord | None:
    try:
        return AttemptRecord.read(layout.attempt_record(shard_id, attempt_id))
    except Exception:  # noqa: BLE001 - informational: a missing or odd record only weakens the estimate
        return None


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
        view = job_summary.current_view(self.layout, self.manifest)
        if view is not None:  # the summary has every node's pace and the live claims: no reads of our own
            return self._answer(self._from_summary(view), started)
        listings = _list_and_sample(self.layout, self.manifest, self._done_spans, MAX_NEW_SPANS, None)
        valid_for = self._cannot_decline_for(listings)
        if valid_for is not None:
            return self._answer(True, started, valid_for)
        pace = observe(self.layout, self.manifest, self._done_spans, listings=listings)
        mine = self._mine(pace.secs_by_node, pace.first_secs_by_node)
        others = [
            pace.secs_by_node[node]
            for node, pid in pace.running
            if (node, pid) != (self.node_id, self.pid) and node in pace.secs_by_node
        ]
        allowed = should_claim(mine, others, pace.pending)
        if not allowed and not self._declined:
            logger.info(
                f"not claiming: {len(others)} running worker(s) finish the {pace.pending} pending shard(s) "
                f"sooner than this node's {mine:.1f}s per shard"
            )
        return self._answer(allowed, started)

    def _from_summary(self, view: job_summary.SummaryView) -> bool:
        """:func:`should_claim` with the summary's node paces, live claims and pending count."""
        nodes = view.summary.nodes
        secs = {n.node_id: n.secs_per_shard for n in nodes if n.secs_per_shard is not None}
        first = {n.node_id: n.first_secs for n in nodes if n.first_secs is not None}
        mine = self._mine(secs, first)
        others = [
            secs[claim.node_id]
            for claim in view.summary.live
            if not claim.stale and (claim.node_id, claim.pid) != (self.node_id, self.pid) and claim.node_id in secs
        ]
        counts = view.counts()
        pending = counts["pending"] + counts["stale"]
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
        """Seconds for which :func:`should_claim` must say yes, judged from the two listings
        alone, or None when the leases must be read.  At least the never-claimed shards are
        pending, and at most every claimed, not done shard is a running worker as fast as
        the fastest node known; outside the tail this spares reading the lease of every
        live claim (O(workers)) and, through the returned time, the listings themselves:
        the margin cannot be used up before that many claims were made, and each of those
        (at most all the claimed shards' workers plus this one) needs a shard time."""
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
