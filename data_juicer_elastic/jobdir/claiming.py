"""Finding a task to claim without O(tasks) work per claim, and without W workers racing for one: a
:class:`ClaimCursor` per worker, the job summary when fresh (docs/scale.md, "How a worker finds a
shard"), a claim published only once the worker can run it (``before_claim``); and claim-ahead
(:class:`ClaimAhead`: in the running shard's tail, the next one claimed, renewed, checked and read on a
helper thread; lease rules: docs/failure-semantics.md, "The shard claimed ahead").

Thread safety: the helper is the only user of the Claimer while it claims; the worker loop waits
for that (:meth:`ClaimAhead.wait_claimed`) before it touches the Claimer again.  A release racing
the helper's claim is never lost: the helper reads the cancellation under the lock it stores its
claim under, and releases the claim itself.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from loguru import logger

from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.heartbeats import Heartbeater
from data_juicer_elastic.jobdir.layout import JobLayout, check_inside
from data_juicer_elastic.jobdir.manifest import check_shard_file
from data_juicer_elastic.jobdir.records import Claim, Manifest, ReleaseReason, ShardEntry, TakeoverReason
from data_juicer_elastic.jobdir.shard_state import ShardState, decide_state, read_markers
from data_juicer_elastic.jobdir.task_queue import (
    TaskQueue,
    publish_claim,
    publish_terminal_if_exhausted,
    read_lease,
    release_claim,
    takeover_reason,
)
from data_juicer_elastic.rows.shard_source import ShardSource
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import pid_alive

MAX_JUMPS: Final = 4  # random jumps per claim before walking sequentially through the rest
# With a summary: shards it showed free that turned out taken before a worker waits for the next (no herd).
MAX_TAKEN_PER_SUMMARY: Final = 3
LIST_AFTER_SURPRISES: Final = 16  # unknown done markers read since the last listing that trigger one
TAIL_POLL_SECS: Final = 0.2  # how often the helper looks whether the current shard reached its tail
FileStamp = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


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
    """One worker's claim path over the tasks of a queue: the cursor plus the per-task checks of the
    lease protocol.  ``manifest``: the job's manifest (for scans, its plan), whose shards are the tasks."""

    def __init__(
        self, queue: TaskQueue, manifest, *, claim_gate=None, rng=None, before_claim=None, random_start=False,
        summary_reader=None,
    ):  # fmt: skip
        self.queue, self.layout, self.identity = queue, queue.layout, queue.identity
        self.tasks: Sequence[ShardEntry] = manifest.shards
        self.claim_gate = claim_gate
        # before_claim() -> bool: make this worker ready to run a shard (start its runtime); True when
        # that took time, so the lease read before it may be out of date.  Never holds a claim meanwhile.
        self.before_claim = before_claim
        rng = rng or random.Random()
        claimed_before = random_start and fsio.list_names(self.layout.claims_dir)  # one listing of claims/
        start = rng.randrange(len(self.tasks)) if claimed_before else 0
        self.cursor = ClaimCursor(len(self.tasks), rng, start=start)
        self.index = {entry.shard_id: i for i, entry in enumerate(self.tasks)}
        self.known_done: set[str] = set()  # done, from a parsed marker or a done/ listing (job_outcome skips them)
        self._held: dict[str, int | None] = {}  # shard seen held by a live claim -> its local pid (None: remote)
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
            entry = self.tasks[i]
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
                self.queue.holding(outcome)  # the summary's writer learns of it from our pace record
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
        shards = self.tasks
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
        age = self.queue.observer.unchanged_for(shard)
        return age is not None and age < self.queue.ttl_secs

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
        queue = self.queue
        if publish_terminal_if_exhausted(self.layout, shard, queue.max_retries, None, queue.max_holder_deaths):
            return TERMINAL
        view = read_lease(self.layout, shard)
        reason = takeover_reason(view, self.identity, queue.observer, vouched)
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
        if takeover and queue.record_takeover(view, reason).terminal is not None:
            return TERMINAL
        claim = publish_claim(self.layout, view, self.identity, self.identity.new_attempt_id(), reason)
        if claim is None:
            return BUSY  # another worker took this generation first
        queue.pending = claim  # a signal from here on must release it
        if fsio.exists(self.layout.done(shard)):
            # Published between our check and our claim (a slow or zombie attempt): nothing to do.
            release_claim(self.layout, claim, ReleaseReason.FINISHED)
            queue.pending = None
            self.learn_done(shard)
            return RETIRED
        logger.info(f"claimed {shard} gen {claim.generation} ({reason}) as {claim.attempt_id}")
        return claim


def source_stamps(source: ShardSource) -> tuple[FileStamp, ...]:
    """The stamps of every file a shard's content is read from (its copy, or its inputs)."""
    stats = [os.stat(path) for path in source.files]
    return tuple((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)


@dataclass
class AheadShard:
    """A shard held ahead: its claim, its heartbeat, and the input file as it was checked."""

    entry: ShardEntry
    claim: Claim
    heartbeater: Heartbeater
    # checked (a copy: size + sha256; inputs: size + mtime, then hashed as read) and unchanged while read ahead
    checked: tuple[ShardSource, tuple[FileStamp, ...]] | None = None
    read: object = None  # what read_ahead(source) returned (for ShardTask.read_ahead), when checked

    def still_checked(self, layout: JobLayout) -> bool:
        """The checked files are still the ones the run would read: a copy inside the job dir, and
        the same inodes, sizes and mtimes.  Then the run need not check them again (else it does)."""
        if self.checked is None:
            return False
        source, stamps = self.checked
        try:
            if source.copy is not None:
                check_inside(layout, Path(source.copy))
            return source_stamps(source) == stamps
        except Exception:  # noqa: BLE001 - any doubt: the run checks the files itself
            return False


class _Cycle:
    """One helper run: wait for the current shard's tail, claim at most one shard, then check and read it."""

    def __init__(self, in_tail: Callable[[], bool] | None) -> None:
        self.in_tail = in_tail
        self.go = threading.Event()  # claim now: the current shard's run ended (or the gate opened)
        self.thread: threading.Thread | None = None
        self.claimed = threading.Event()  # set once the helper no longer uses the Claimer
        self.held: AheadShard | None = None
        self.cancelled: ReleaseReason | None = None  # release reason, once the worker gave the cycle up
        self.error: BaseException | None = None  # raised by claim_next; re-raised by take()


class ClaimAhead:
    """At most one shard claimed ahead for one worker slot."""

    def __init__(
        self,
        queue: TaskQueue,
        manifest: Manifest,
        claim_next: Callable[[], tuple[tuple[ShardEntry, Claim] | None, bool]],
        read_ahead: Callable[[ShardSource], object] | None = None,
    ):
        self.queue, self.layout, self.manifest, self.claim_next = queue, queue.layout, manifest, claim_next
        self.read_ahead = read_ahead
        self.unrun = 0  # shards claimed ahead and released without running
        self._lock = threading.Lock()
        self._cycle: _Cycle | None = None
        self._closed = False

    def start(self, in_tail: Callable[[], bool] | None = None) -> bool:
        """Claim the next shard on a helper thread (no-op while one is held or being claimed), once
        ``in_tail()`` is true or the current shard's run ended (None: at once)."""
        with self._lock:
            if self._closed or self._cycle is not None:
                return False
            cycle = self._cycle = _Cycle(in_tail)
        cycle.thread = threading.Thread(target=self._work, args=(cycle,), name="dj-elastic-claim-ahead", daemon=True)
        cycle.thread.start()
        return True

    def run_ended(self) -> None:
        """The current shard's run ended: a helper still waiting for the tail claims now (no wait)."""
        cycle = self._cycle
        if cycle is not None:
            cycle.go.set()

    def wait_claimed(self) -> None:
        """Wait until the helper no longer uses the Claimer (its claim is made, or none was);
        one still waiting for the tail claims now."""
        cycle = self._cycle
        if cycle is not None:
            cycle.go.set()
            cycle.claimed.wait()

    def take(self) -> AheadShard | None:
        """The held shard, to be run now (None when none was claimed, or its lease was lost), once
        the helper's check and read are done; re-raises an error of its claim.  The shard stays
        this object's until it is the queue's pending claim: a signal at any moment finds it here,
        or there, and releases it."""
        cycle = self._cycle
        if cycle is None:
            return None
        cycle.go.set()
        cycle.thread.join()  # interrupted (SIGTERM): the cycle is still ours, close() releases its shard
        ahead = cycle.held
        if cycle.error is not None:
            self._forget(cycle)
            raise cycle.error
        if ahead is None:
            self._forget(cycle)
            return None
        ahead.heartbeater.stop()  # the run starts its own heartbeater (with liveness) at once
        if not ahead.heartbeater.held():
            logger.warning(f"{ahead.claim.shard_id}: the lease of the shard claimed ahead was lost; not running it")
            self.release(ReleaseReason.UNRUN, why="its lease was lost")
            self._forget(cycle)
            return None
        self.queue.pending = ahead.claim
        self._forget(cycle)
        return ahead

    def _forget(self, cycle: _Cycle) -> None:
        """The cycle is over (its shard taken, released or never claimed): the next may start."""
        with self._lock:
            cycle.held = None
            if self._cycle is cycle:
                self._cycle = None

    def release(
        self, reason: ReleaseReason = ReleaseReason.UNRUN, *, why: str = "", wait_secs: float | None = 0.0
    ) -> None:
        """Hand the held shard back now (any thread; idempotent).  A claim the helper is still
        making is released by the helper itself.  ``wait_secs``: then wait this long for the
        helper to finish claiming and handing that claim back (a process about to exit), None:
        until it has."""
        with self._lock:
            cycle = self._cycle
            if cycle is None:
                return
            if cycle.cancelled is None or reason is ReleaseReason.SIGNAL:  # a signal while handing back: say so
                cycle.cancelled = reason
            ahead, cycle.held = cycle.held, None
        cycle.go.set()  # a helper waiting for the tail stops waiting (and claims nothing)
        if ahead is not None:
            logger.info(f"{ahead.claim.shard_id}: handing back the shard claimed ahead ({why or reason})")
            self._hand_back(ahead, reason)
        if wait_secs != 0.0:
            cycle.claimed.wait(wait_secs)

    def close(self, reason: ReleaseReason, *, why: str = "", wait_secs: float | None = None) -> None:
        """Release whatever is held and claim nothing more (the worker is leaving)."""
        with self._lock:
            self._closed = True
        self.release(reason, why=why, wait_secs=wait_secs)
        cycle = self._cycle
        if cycle is not None and cycle.thread is not None and wait_secs is None:
            cycle.thread.join()  # its read-ahead too: nothing of this worker runs on after it

    def _work(self, cycle: _Cycle) -> None:
        try:
            ahead = self._claim(cycle)
        except BaseException as exc:  # noqa: BLE001 - handed to the worker loop by take()
            cycle.error, ahead = exc, None
        finally:  # only now: a worker about to exit waits for this (release(wait_secs=...))
            cycle.claimed.set()
        if ahead is not None:
            claim = ahead.claim
            logger.info(f"claimed {claim.shard_id} ahead (gen {claim.generation}) while the current shard runs")
            self._check_and_read(ahead)

    def _claim(self, cycle: _Cycle) -> AheadShard | None:
        while cycle.in_tail is not None and not cycle.go.wait(TAIL_POLL_SECS):
            try:
                if cycle.in_tail():
                    break
            except Exception:  # noqa: BLE001 - a progress reading must not end the helper: claim at the end
                cycle.in_tail = lambda: False
        if cycle.cancelled is not None:  # given up while waiting: nothing was claimed
            return None
        found, _ = self.claim_next()
        if found is None:
            return None
        entry, claim = found
        heartbeater = self.queue.heartbeater(claim)
        ahead = AheadShard(entry, claim, heartbeater)
        with self._lock:
            cancelled = cycle.cancelled
            if cancelled is None:
                heartbeater.start()  # renewed from the moment it is claimed
                cycle.held = ahead
                return ahead
        # the worker gave the cycle up while we were claiming
        logger.info(f"{claim.shard_id}: handing back the shard claimed ahead ({cancelled})")
        self._hand_back(ahead, cancelled, started=False)
        return None

    def _check_and_read(self, ahead: AheadShard) -> None:
        """Check the input file and read it ahead; any error is left to the run, which checks and
        reads the file again (a corrupt shard then fails its attempt as it always did)."""
        try:
            source = check_shard_file(self.layout, self.manifest, ahead.entry)
            before = source_stamps(source)
            read = self.read_ahead(source) if self.read_ahead is not None else None
            if source_stamps(source) == before:  # else the run checks and reads the files itself
                ahead.checked, ahead.read = (source, before), read
        except Exception as exc:  # noqa: BLE001
            logger.info(f"{ahead.claim.shard_id}: not read ahead ({type(exc).__name__}: {exc}); the run reads it")

    def _hand_back(self, ahead: AheadShard, reason: ReleaseReason, *, started: bool = True) -> None:
        if started:
            ahead.heartbeater.stop()
        try:  # the pace record stops listing it too
            self.queue.release(ahead.claim, reason, f"{ahead.claim.shard_id} (claimed ahead)")
        except Exception as exc:  # noqa: BLE001 - a hint's bookkeeping must not keep a claim
            logger.warning(f"{ahead.claim.shard_id}: {exc}")
        with self._lock:
            self.unrun += 1
