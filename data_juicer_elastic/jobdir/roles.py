"""Roles one process holds at a time, each the one task of a lease namespace (:class:`Role`: the
summary writer, a run's prepare and finalize), and the job summary its writer composes, in
O(workers + live claims) metadata operations: docs/leases-on-nfs.md, items 6 and 8.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Final

from loguru import logger

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import attempts, heartbeats, task_queue
from data_juicer_elastic.jobdir.heartbeats import Clock, Sighting, StalenessObserver
from data_juicer_elastic.jobdir.job_summary import (
    JobSummary,
    LiveClaim,
    NodePace,
    PaceRecord,
    PaceWriter,
    SummaryReader,
    brief_of,
    encode_bitmap,
    refresh_paces,
    write_summary,
)
from data_juicer_elastic.jobdir.layout import ROLE_TASK, JobLayout
from data_juicer_elastic.jobdir.records import Claim, Manifest, ReleaseReason, TakeoverReason
from data_juicer_elastic.jobdir.task_queue import TaskQueue
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity


def read_holder(layout: JobLayout) -> tuple[Claim | None, str | None]:
    """(the latest claim of the role, what made it unreadable): who holds or held it."""
    view = task_queue.read_lease(layout, ROLE_TASK)
    return view.claim, view.claim_error


class Role:
    """The one task of the lease namespace ``layout``, held through a :class:`TaskQueue` over it:
    claimed, renewed, fenced and taken over by the shard lease rules (the staleness observer on
    this role's clock)."""

    def __init__(
        self,
        layout: JobLayout,
        identity: WorkerIdentity,
        *,
        ttl_secs: float,
        heartbeat_secs: float,
        clock: Clock = time.monotonic,
    ):
        self.layout, self.identity = layout, identity
        self.queue = TaskQueue(layout, identity, ttl_secs=ttl_secs, heartbeat_secs=heartbeat_secs, clock=clock)
        self.claim: Claim | None = None
        self.heartbeater: heartbeats.Heartbeater | None = None  # renews the claim: start() it, or beat() by hand

    def takeover_reason(self) -> TakeoverReason | None:
        """Why the role may be claimed (or its holder is gone), None while it is held."""
        return self.queue.takeover_reason(ROLE_TASK)

    def acquire(self, holder_id: str, *, take_over: bool = True) -> Claim | None:
        """Claim the role under ``holder_id``: the first claim, or (``take_over``) a claim over a
        holder that released it, failed, died or went stale.  None when another holds it or claimed
        first."""
        claim = self.queue.take(ROLE_TASK, holder_id, take_over=take_over)
        if claim is not None:
            self.claim, self.heartbeater = claim, self.queue.heartbeater(claim)
        return claim

    def held(self) -> bool:
        """Self-fencing: renewed in time and no newer generation claimed; a lost role is let go."""
        if self.claim is not None and self.heartbeater.held():
            return True
        self.stop()
        return False

    def stop(self) -> None:
        """Stop renewing and let the role go, unreleased: it is taken over once stale."""
        if self.heartbeater is not None:
            self.heartbeater.stop()
        self.claim = self.heartbeater = None

    def release(self, reason: ReleaseReason, what: str) -> None:
        """Stop renewing and release the role (a write error only logged)."""
        claim = self.claim
        self.stop()
        if claim is not None:
            self.queue.release(claim, reason, what)


# The summary is missing or has not advanced for this many intervals: look at the writer's lease.
SILENT_INTERVALS: Final = 3


def compose_summary(
    layout: JobLayout,
    manifest: Manifest,
    paces: dict[str, PaceRecord],
    observer: StalenessObserver,
    identity: WorkerIdentity,
    *,
    seq: str,
    writer: str,
    interval_secs: float,
    index: dict[str, int] | None = None,
) -> JobSummary:
    """One round: the done set and terminal failures from two listings, the live claims and
    the nodes' pace from the pace records, one heartbeat read per live claim.  ``index``: each
    shard's place in the manifest (a keeper builds it once, not every round)."""
    index = index if index is not None else {entry.shard_id: i for i, entry in enumerate(manifest.shards)}
    done = {shard for shard in attempts.list_done(layout) if shard in index}
    failed = sorted(shard for shard in attempts.marker_ids(layout.failed_dir) if shard in index and shard not in done)
    newest: dict[str, tuple[PaceRecord, int, str]] = {}  # shard -> (holder's record, generation, attempt)
    for record in paces.values():
        for held in record.held if not record.stopped else ():
            known = newest.get(held.shard_id)
            if held.shard_id in index and held.shard_id not in done and (known is None or known[1] < held.generation):
                newest[held.shard_id] = (record, held.generation, held.attempt_id)
    for shard in done:
        observer.forget(shard)
    held = sorted(newest.items())
    beats = fsio.read_many(lambda item: heartbeats.read_heartbeat(layout, item[0], item[1][1]), held)  # judged in order
    live = [_watch(observer, identity, shard, *h, beat) for (shard, h), beat in zip(held, beats, strict=True)]
    return JobSummary(
        job_id=manifest.job_id,
        num_shards=manifest.num_shards,
        seq=seq,
        writer=writer,
        written_at=time.time(),
        ttl_secs=observer.ttl_secs,
        interval_secs=interval_secs,
        done=encode_bitmap([index[s] for s in done], manifest.num_shards),
        done_count=len(done),
        failed=failed,
        live=live,
        nodes=_node_paces(paces, live),
    )


def _watch(observer, identity, shard: str, record: PaceRecord, generation: int, attempt: str, beat) -> LiveClaim:
    heartbeat, error = beat
    token = heartbeats.token_text(generation, heartbeat, error)
    unchanged = observer.observe(Sighting(shard, token))
    dead = task_queue.process_gone_here(identity, record)
    return LiveClaim(
        shard_id=shard,
        generation=generation,
        attempt_id=attempt,
        node_id=record.node_id,
        pid=record.pid,
        token=token,
        unchanged_secs=round(unchanged, 3),
        stale=dead or unchanged >= observer.ttl_secs,
    )


def _node_paces(paces: dict[str, PaceRecord], live: list[LiveClaim]) -> list[NodePace]:
    by_node: dict[str, list[PaceRecord]] = {}
    for record in paces.values():
        by_node.setdefault(record.node_id, []).append(record)
    running = Counter(claim.node_id for claim in live if not claim.stale)
    nodes = []
    for node, records in sorted(by_node.items()):
        done = sum(r.done for r in records)
        warm_count = sum(r.warm_count for r in records)
        firsts = [r.first_secs for r in records if r.first_secs is not None]
        if warm_count:
            secs = sum(r.warm_secs for r in records) / warm_count
        else:
            secs = sum(firsts) / len(firsts) if firsts else None
        nodes.append(
            NodePace(
                node_id=node,
                workers=sum(1 for r in records if not r.stopped),
                running=running.get(node, 0),
                done=done,
                secs_per_shard=secs,
                first_secs=secs if done == 1 else None,
                rows_out=sum(r.rows_out for r in records),
            )
        )
    return nodes


class SummaryKeeper:
    """This process's part in keeping the summary: write it while holding the writer's lease,
    else watch for a silent writer and take its lease over by the shard rules."""

    def __init__(
        self,
        layout: JobLayout,
        manifest: Manifest,
        identity: WorkerIdentity,
        pace: PaceWriter,
        reader: SummaryReader,
        *,
        ttl_secs: float,
        heartbeat_secs: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.layout, self.manifest, self.identity, self.pace, self.reader = layout, manifest, identity, pace, reader
        self.role = Role(layout.summary_lease, identity, ttl_secs=ttl_secs, heartbeat_secs=heartbeat_secs, clock=clock)
        self.ttl_secs, self.clock = ttl_secs, clock
        self.interval_secs = reader.interval_secs
        self.claims_observer = StalenessObserver(ttl_secs, clock)  # the live claims, watched while writing
        self.paces: dict[str, PaceRecord] = {}  # the pace records of the last round
        self.index = {entry.shard_id: i for i, entry in enumerate(manifest.shards)}
        self.rounds = 0
        self._last_tick: float | None = None
        self._thread = heartbeats.PeriodicThread(
            self.interval_secs, self._safe_tick, "dj-elastic-summary", join_secs=max(5.0, 2 * self.interval_secs)
        )

    @property
    def writing(self) -> bool:
        return self.role.claim is not None

    # -- one step (the thread calls it every interval; tests call it directly) -------------------------
    def tick(self) -> None:
        self.pace.flush()
        if self.role.claim is None and not self._acquire():
            return
        if not self._still_ours():
            return
        self.rounds += 1
        self.paces = refresh_paces(self.layout, self.paces)
        summary = compose_summary(
            self.layout,
            self.manifest,
            self.paces,
            self.claims_observer,
            self.identity,
            seq=f"{self.role.claim.generation}.{self.rounds}",
            writer=self.pace.key,
            interval_secs=self.interval_secs,
            index=self.index,
        )
        if self._still_ours():  # again: the round may have taken a while (a writer cannot be fenced
            write_summary(self.layout, summary, brief_of(summary, self.index))  # while it writes; readers drop
            # an older generation's round)

    def tick_if_due(self) -> None:
        """A round when an interval has passed on this keeper's clock (a worker loop driving the
        keeper itself, with a caller's clock, instead of the thread)."""
        now = self.clock()
        if self._last_tick is None or now - self._last_tick >= self.interval_secs:
            self._last_tick = now
            self._safe_tick()

    def _acquire(self) -> bool:
        self.reader.view()  # learn whether the summary advances (cached: at most one small read)
        unchanged = self.reader.unchanged_for()
        if unchanged is not None and unchanged < SILENT_INTERVALS * self.interval_secs:
            return False  # the writer is not silent
        claim = self.role.acquire(self.identity.new_attempt_id())
        if claim is None:
            return False  # the writer is live, or another process became the writer first
        logger.info(f"writing the job summary (writer lease gen {claim.generation}, {claim.takeover_reason})")
        self.rounds = 0
        self.claims_observer = StalenessObserver(self.ttl_secs, self.clock)  # a new writer watches for a TTL first
        self.role.heartbeater.start()
        return True

    def _still_ours(self) -> bool:
        """Self-fencing before each round: a lost lease or a newer writer ends our writing."""
        if self.role.held():
            return True
        logger.info("no longer the job summary's writer (its lease was taken over)")
        return False

    # -- the thread ----------------------------------------------------------------------------------
    def start(self) -> SummaryKeeper:
        self._thread.start()
        return self

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except (OSError, JobDirError) as exc:  # the summary is a hint: a failed round is retried next time
            logger.warning(f"job summary: {exc}")

    def stop(self) -> None:
        """Leave: a last round (when writing) and a released lease, so the next writer starts at once."""
        self._thread.stop()
        self.pace.flush(stopped=True)
        if self.role.claim is None:
            return
        self._safe_tick()  # the last round may find the lease taken over: then there is nothing to release
        self.role.release(ReleaseReason.LEFT, "the job summary's writer lease")
