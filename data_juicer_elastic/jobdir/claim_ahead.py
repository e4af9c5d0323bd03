"""Claim-ahead: in the running shard's tail, claim the next shard on a helper thread through the
worker's own claim path, renew it, check and read its input (lease rules: docs/failure-semantics.md,
"The shard claimed ahead").

Thread safety: the helper is the only user of the Claimer while it claims; the worker loop waits
for that (:meth:`ClaimAhead.wait_claimed`) before it touches the Claimer again.  A release racing
the helper's claim is never lost: the helper reads the cancellation under the lock it stores its
claim under, and releases the claim itself.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from loguru import logger

from data_juicer_elastic.jobdir import layout as confine
from data_juicer_elastic.jobdir import leases
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import check_shard_file
from data_juicer_elastic.jobdir.records import Claim, Manifest, ReleaseReason, ShardEntry
from data_juicer_elastic.rows.shard_source import ShardSource

TAIL_POLL_SECS: Final = 0.2  # how often the helper looks whether the current shard reached its tail
FileStamp = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def source_stamps(source: ShardSource) -> tuple[FileStamp, ...]:
    """The stamps of every file a shard's content is read from (its copy, or its inputs)."""
    stats = [os.stat(path) for path in source.files]
    return tuple((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)


@dataclass
class AheadShard:
    """A shard held ahead: its claim, its heartbeat, and the input file as it was checked."""

    entry: ShardEntry
    claim: Claim
    heartbeater: leases.Heartbeater
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
                confine.check_inside(layout, Path(source.copy))
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
        layout: JobLayout,
        manifest: Manifest,
        claim_next: Callable[[], tuple[tuple[ShardEntry, Claim] | None, bool]],
        *,
        heartbeat_secs: float,
        ttl_secs: float,
        clock: Callable[[], float],
        read_ahead: Callable[[ShardSource], object] | None = None,
        on_release: Callable[[Claim, ReleaseReason], object] | None = None,
    ):
        self.layout, self.manifest, self.claim_next = layout, manifest, claim_next
        self.on_release = on_release  # a shard handed back: e.g. the pace record stops listing it
        self.heartbeat_secs, self.ttl_secs, self.clock = heartbeat_secs, ttl_secs, clock
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

    def take(self, hand_over: Callable[[Claim], object] = lambda claim: None) -> AheadShard | None:
        """The held shard, to be run now (None when none was claimed, or its lease was lost), once
        the helper's check and read are done; re-raises an error of its claim.  The shard stays
        this object's until ``hand_over(claim)`` has returned (the caller records it as its pending
        claim there): a signal at any moment finds it here, or there, and releases it."""
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
        hand_over(ahead.claim)
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
        heartbeater = leases.Heartbeater(
            self.layout, claim, heartbeat_secs=self.heartbeat_secs, ttl_secs=self.ttl_secs, clock=self.clock
        )
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
        leases.release_or_warn(self.layout, ahead.claim, reason, f"{ahead.claim.shard_id} (claimed ahead)")
        if self.on_release is not None:
            try:
                self.on_release(ahead.claim, reason)
            except Exception as exc:  # noqa: BLE001 - a hint's bookkeeping must not keep a claim
                logger.warning(f"{ahead.claim.shard_id}: {exc}")
        with self._lock:
            self.unrun += 1
