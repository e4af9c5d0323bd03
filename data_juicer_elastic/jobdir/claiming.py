"""Finding a shard to claim without O(shards) work per claim, and without W workers racing for one:
a :class:`ClaimCursor` per worker, the job summary when fresh (docs/scale.md, "How a worker finds a
shard"), and a claim published only once the worker can run it (``before_claim``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Final

from loguru import logger

from data_juicer_elastic.jobdir import attempts, failures, leases
from data_juicer_elastic.jobdir.records import Claim, FailureReason, ReleaseReason, ShardEntry, TakeoverReason
from data_juicer_elastic.jobdir.shard_state import ShardState, decide_state, read_markers
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import pid_alive

MAX_JUMPS: Final = 4  # random jumps per claim before walking sequentially through the rest
# With a summary: shards it showed free that turned out taken before a worker waits for the next (no herd).
MAX_TAKEN_PER_SUMMARY: Final = 3
LIST_AFTER_SURPRISES: Final = 16  # unknown done markers read since the last listing that trigger one


class ClaimCursor:
    """Which shard to look at next: a pure, in-memory view of one worker (no I/O)."""

    def __init__(self, num_shards: int, rng: random.Random, start: int = 0):
        if num_shards < 1:
            raise ValueError("a job has at least one shard")
        self.n = num_shards
        self.rng = rng
        self.position = start % num_shards
        # Union-find "next index >= i that is not retired" (retired = done or unclaimable
        # for good); index n is the sentinel.  Skipping runs of done shards costs ~O(1).
        self._next = list(range(num_shards + 1))
        self.retired = 0
        self.surprises = 0  # done markers found by reading since the last listing
        self.listed = False  # at least one done/ listing was taken
        self._visited: set[int] | None = None
        self._jump = False

    def is_retired(self, index: int) -> bool:
        return self._find(index) != index

    def retire(self, index: int) -> bool:
        """Never look at ``index`` again (done, or a corrupt done marker); True if it was new."""
        if self.is_retired(index):
            return False
        self._next[index] = index + 1
        self.retired += 1
        if self._visited is not None:
            self._visited.discard(index)
        return True

    @property
    def remaining(self) -> int:
        return self.n - self.retired

    def wants_listing(self) -> bool:
        return not self.listed or self.surprises >= LIST_AFTER_SURPRISES

    def walk(self) -> Iterator[int]:
        """Indices to probe for one claim, each unretired shard at most once.  After a probe the caller
        may call :meth:`jump` (someone else works here) or :meth:`claimed` (stop)."""
        visited: set[int] = set()
        self._visited = visited
        jumps = 0
        index = self.position
        try:
            while len(visited) < self.remaining:
                index = self._next_unvisited(index, visited)
                visited.add(index)
                self._jump = False
                yield index
                if self._jump and jumps < MAX_JUMPS:
                    jumps += 1
                    index = self.rng.randrange(self.n)
                else:
                    index = (index + 1) % self.n
        finally:
            self._visited = None

    def jump(self) -> None:
        self._jump = True

    def claimed(self, index: int) -> None:
        self.position = (index + 1) % self.n

    def _next_unvisited(self, index: int, visited: set[int]) -> int:
        # Only called while an unvisited, unretired index exists, so this terminates.
        while True:
            candidate = self._find(index)
            if candidate == self.n:
                candidate = self._find(0)
            if candidate not in visited:
                return candidate
            index = (candidate + 1) % self.n

    def _find(self, index: int) -> int:
        nxt = self._next
        root = index
        while nxt[root] != root:
            root = nxt[root]
        while nxt[index] != root:  # path compression
            nxt[index], index = root, nxt[index]
        return root


# Probe outcomes (what one shard turned out to be).
RETIRED: Final = "retired"  # done (or a corrupt done marker): never again
SURPRISE: Final = "surprise"  # done, and we had not known: retired, and we are in someone's wake
TERMINAL: Final = "terminal"  # failed for good (until `dj-elastic retry`)
BUSY: Final = "busy"  # someone else's: held, or we lost the link race
DECLINED: Final = "declined"  # pending, but the straggler gate said not now


class Claimer:
    """One worker's claim path: the cursor plus the per-shard checks of the lease protocol."""

    def __init__(
        self,
        layout,
        manifest,
        identity,
        observer,
        *,
        max_retries,
        max_holder_deaths=None,
        claim_gate=None,
        rng=None,
        before_claim=None,
        random_start=False,
        summary_reader=None,
    ):
        self.layout, self.manifest, self.identity, self.observer = layout, manifest, identity, observer
        self.max_retries, self.max_holder_deaths, self.claim_gate = max_retries, max_holder_deaths, claim_gate
        # before_claim() -> bool: make this worker ready to run a shard (start its runtime); True when
        # that took time, so the lease read before it may be out of date.  Never holds a claim meanwhile.
        self.before_claim = before_claim
        rng = rng or random.Random()
        claimed_before = random_start and fsio.list_names(self.layout.claims_dir)  # one listing of claims/
        start = rng.randrange(manifest.num_shards) if claimed_before else 0
        self.cursor = ClaimCursor(manifest.num_shards, rng, start=start)
        self.index = {entry.shard_id: i for i, entry in enumerate(manifest.shards)}
        self.known_done: set[str] = set()  # done, from a parsed marker or a done/ listing (job_outcome skips them)
        self._held: dict[str, int | None] = {}  # shard seen held by a live claim -> its local pid (None: remote)
        self.pending: Claim | None = None  # published and not yet handed to the caller
        self.summary = summary_reader  # jobdir.job_summary.SummaryReader, when there is one
        self._summary_seen: str | None = None  # the brief (its checksum) whose done set was learned

    def learn_done(self, shard_id: str, *, corrupt: bool = False) -> None:
        if not corrupt:  # a corrupt marker is never replaced either: retired, but not done
            self.known_done.add(shard_id)
        self.cursor.retire(self.index[shard_id])
        self._held.pop(shard_id, None)

    def claim_next(self) -> tuple[tuple[ShardEntry, Claim] | None, bool]:
        """(entry, claim) for a shard we won, else (None, every shard is finished)."""
        cursor = self.cursor
        view = self.summary.view() if self.summary is not None else None
        if view is not None:
            self._learn_summary(view)
        listed = view is None and cursor.wants_listing() and self._list_done()
        finished, taken = True, 0
        for i in cursor.walk():
            entry = self.manifest.shards[i]
            vouched = None
            if view is not None:
                shard = entry.shard_id
                if view.held_by_other(shard, self.identity.pid, self.identity.node_id):
                    finished = False  # someone else's live claim: no probe until the summary says otherwise
                    continue
                if shard in view.failed:
                    continue  # failed for good (until `dj-elastic retry`): as TERMINAL, without reading it
                vouched = view.stale_token(shard)
            outcome = self._probe(entry, vouched)
            if view is not None and outcome == BUSY:
                taken += 1
                if taken >= MAX_TAKEN_PER_SUMMARY:
                    return None, False  # the summary is behind here: look again at the next one
            if isinstance(outcome, Claim):
                cursor.claimed(i)
                return (entry, outcome), False
            if outcome == SURPRISE and not listed and cursor.wants_listing():
                listed = self._list_done()  # many unknown markers: one listing beats reading them (once per call)
            if outcome in (BUSY, SURPRISE):
                cursor.jump()  # another worker's region: look elsewhere
            if outcome in (BUSY, DECLINED):
                finished = False
        return None, finished

    def _learn_summary(self, view) -> None:
        """Retire the shards a new summary shows done (a done/ listing's names, as :meth:`_list_done`)."""
        if view.brief.checksum == self._summary_seen:
            return  # a later round with the same brief: nothing new
        self._summary_seen = view.brief.checksum
        shards = self.manifest.shards
        for i in view.done_indices():
            if not self.cursor.is_retired(i):
                self.learn_done(shards[i].shard_id)

    def _list_done(self) -> bool:
        for shard in attempts.list_done(self.layout):
            if shard in self.index:
                self.learn_done(shard)
        self.cursor.listed, self.cursor.surprises = True, 0
        return True

    def _not_due(self, shard: str) -> bool:
        """Seen held by a live claim, and no observer could call it stale yet: skip its lease."""
        if shard not in self._held:
            return False
        pid = self._held[shard]
        if pid is not None and not pid_alive(pid):
            return False  # a holder on this host died: read now, HOLDER_DEAD applies at once
        age = self.observer.unchanged_for(shard)
        return age is not None and age < self.observer.ttl_secs

    def _probe(self, entry: ShardEntry, vouched: str | None = None) -> Claim | str:
        shard = entry.shard_id
        markers = read_markers(self.layout, shard, failed=False)
        settled = decide_state(markers) is not ShardState.PENDING
        if not settled and vouched is None and self._not_due(shard):
            return BUSY  # held, not done, and not stale yet: its lease need not be read (8 ops saved)
        was_held = self._held.pop(shard, False) is not False
        if settled:
            # DONE is terminal, and a corrupt marker cannot be replaced either (job_outcome reports it).
            self.learn_done(shard, corrupt=markers.corrupt_done)
            if markers.corrupt_done or was_held:
                return RETIRED  # a holder we watched finished: expected, not someone else's wake
            self.cursor.surprises += 1
            return SURPRISE
        if failures.publish_terminal_if_exhausted(self.layout, shard, self.max_retries, None, self.max_holder_deaths):
            return TERMINAL
        view = leases.read_lease(self.layout, shard)
        reason = leases.takeover_reason(view, self.identity, self.observer, vouched)
        if reason is not None and self.before_claim is not None and self.before_claim():
            return self._probe(entry, vouched)  # ready now (it took a while): look at the shard afresh
        if reason is None:
            local = view.claim is not None and self.identity.same_kernel_namespace(
                view.claim.hostname, view.claim.boot_id, view.claim.pid_namespace
            )
            self._held[shard] = view.claim.pid if local else None
            return BUSY
        takeover = reason in (TakeoverReason.STALE, TakeoverReason.HOLDER_DEAD)
        if not takeover and self.claim_gate and not self.claim_gate():
            return DECLINED  # faster workers will take it sooner; a dead holder's shard is always taken
        if takeover and self._record_takeover(view, reason).terminal is not None:
            return TERMINAL
        claim = leases.publish_claim(self.layout, view, self.identity, self.identity.new_attempt_id(), reason)
        if claim is None:
            return BUSY  # another worker took this generation first
        self.pending = claim  # a signal from here on must release it
        if fsio.exists(self.layout.done(shard)):
            # Published between our check and our claim (a slow or zombie attempt): nothing to do.
            leases.release_claim(self.layout, claim, ReleaseReason.FINISHED)
            self.pending = None
            self.learn_done(shard)
            return RETIRED
        logger.info(f"claimed {shard} gen {claim.generation} ({reason}) as {claim.attempt_id}")
        return claim

    def _record_takeover(self, view: leases.LeaseView, reason: TakeoverReason) -> failures.FailureOutcome:
        # A holder that vanished without a record is a death, with its own budget (docs/failure-semantics.md).
        holder = view.claim
        what = f"{holder.node_id} ({holder.hostname} pid {holder.pid})" if holder else "unknown holder"
        if reason == TakeoverReason.STALE:
            error = f"lease expired: {what} stopped renewing its claim (killed, lost or hung)"
            return self.fail(holder, view.shard_id, view.generation, error, "LeaseExpired", FailureReason.LEASE_EXPIRED)
        error = f"holder {what} died on this host without releasing its claim"
        return self.fail(holder, view.shard_id, view.generation, error, "LeaseExpired", FailureReason.HOLDER_DEAD)

    def fail(
        self, holder: Claim | None, shard_id: str, generation: int, error: str, error_type: str, reason: FailureReason
    ) -> failures.FailureOutcome:
        """Record a generation's failure against the shard's budgets (``failures.record_failure``)."""
        return failures.record_failure(
            self.layout,
            holder,
            shard_id=shard_id,
            generation=generation,
            error=error,
            error_type=error_type,
            exit_reason=reason,
            max_retries=self.max_retries,
            reporter=self.identity,
            max_holder_deaths=self.max_holder_deaths,
        )
