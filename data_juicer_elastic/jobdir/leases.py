"""Claims, heartbeats, staleness, takeover, release and self-fencing of one task's lease.

Rules: docs/leases-on-nfs.md, "The lease protocol built on them"; parameters: docs/failure-semantics.md.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from loguru import logger

from data_juicer_elastic.jobdir import layout as confine
from data_juicer_elastic.jobdir.heartbeats import Clock, RenewThread, StalenessObserver
from data_juicer_elastic.jobdir.layout import JobLayout, parse_gen_name
from data_juicer_elastic.jobdir.liveness import Liveness
from data_juicer_elastic.jobdir.records import Claim, Failure, Heartbeat, Release, ReleaseReason, TakeoverReason
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity, pid_alive


@dataclass(frozen=True)
class LeaseView:
    """What one read of a shard's lease files showed."""

    shard_id: str
    generation: int  # latest claim generation, 0 when never claimed
    claim: Claim | None  # None when missing or corrupt
    claim_error: str | None
    release: Release | None
    failure: Failure | None
    heartbeat: Heartbeat | None
    heartbeat_error: str | None

    @property
    def ended(self) -> bool:
        """The holder of the latest generation gave it up (release or failure record)."""
        return self.release is not None or self.failure is not None

    @property
    def watch_key(self) -> str:
        return self.shard_id

    @property
    def watch_token(self) -> str:
        """What a staleness observer watches (the generation and its heartbeat), as the job summary
        records the value its writer watched."""
        return token_text(self.generation, self.heartbeat, self.heartbeat_error)


def token_text(generation: int, heartbeat: Heartbeat | None, error: str | None) -> str:
    """The watched value of a generation's heartbeat (its sequence, or what made it unreadable)."""
    beat = ["seq", heartbeat.attempt_id, heartbeat.seq] if heartbeat is not None else ["none", error]
    return json.dumps([generation, *beat], separators=(",", ":"))


def latest_generation(layout: JobLayout, shard_id: str) -> int:
    """Highest claim generation of a shard.  The listing is a hint (cached on NFS); names
    above it are probed by opening them, and a missed one only costs a failed link later."""
    gens = [g for g in map(parse_gen_name, fsio.list_names(layout.claim_dir(shard_id))) if g is not None]
    generation = max(gens, default=0)
    while fsio.exists(layout.claim(shard_id, generation + 1)):
        generation += 1
    return generation


def read_lease(layout: JobLayout, shard_id: str) -> LeaseView:
    generation = latest_generation(layout, shard_id)
    if generation == 0:
        return LeaseView(shard_id, 0, None, None, None, None, None, None)
    claim, claim_error = Claim.read_or_error(layout.claim(shard_id, generation))
    if claim is not None and (claim.shard_id, claim.generation) != (shard_id, generation):
        claim, claim_error = None, f"claim file names {claim.shard_id} gen {claim.generation}"
    release, _ = Release.read_or_error(layout.release(shard_id, generation))
    failure, _ = Failure.read_or_error(layout.failure(shard_id, generation))
    heartbeat, hb_error = read_heartbeat(layout, shard_id, generation)
    return LeaseView(shard_id, generation, claim, claim_error, release, failure, heartbeat, hb_error)


def read_heartbeat(layout: JobLayout, shard_id: str, generation: int) -> tuple[Heartbeat | None, str | None]:
    """(heartbeat, error) of one generation: what the summary writer reads of each live claim."""
    heartbeat, error = Heartbeat.read_or_error(layout.heartbeat(shard_id, generation))
    if heartbeat is not None and heartbeat.generation != generation:
        return None, "heartbeat of another generation"
    return heartbeat, error


def heartbeat_age(layout: JobLayout, shard_id: str, generation: int, now: float | None = None) -> float | None:
    """Seconds since the generation's heartbeat (before its first one: its claim) was written, by
    the files' mtimes: for display only, as :func:`heartbeats.looks_stale`."""
    now = time.time() if now is None else now
    for path in (layout.heartbeat(shard_id, generation), layout.claim(shard_id, generation)):
        try:
            return max(0.0, now - fsio.stat(path).st_mtime)
        except OSError:
            continue
    return None


def holder_dead_here(view: LeaseView, identity: WorkerIdentity) -> bool:
    """The claim was made in our kernel and pid namespace and its pid is gone: dead for sure."""
    return view.claim is not None and process_gone_here(identity, view.claim)


def process_gone_here(identity: WorkerIdentity, process) -> bool:
    """``process`` (a record with hostname, boot_id, pid_namespace and pid: a claim, a pace
    record) ran in our kernel and pid namespace, is not us, and its pid is gone."""
    if process.pid == identity.pid:
        return False
    if not identity.same_kernel_namespace(process.hostname, process.boot_id, process.pid_namespace):
        return False
    return not pid_alive(process.pid)


def takeover_reason(
    view: LeaseView, identity: WorkerIdentity, observer: StalenessObserver, vouched_stale: str | None = None
) -> TakeoverReason | None:
    """Why the latest generation may be claimed over, or None while it is held.  Always feeds the
    observer, so its memory of each value is as old as possible.  ``vouched_stale``: the heartbeat
    value the job summary's writer watched unchanged for a TTL (stale for us too if we read it now)."""
    if view.generation == 0:
        return TakeoverReason.FIRST
    stale = observer.is_stale(view) or (vouched_stale is not None and vouched_stale == view.watch_token)
    if view.release is not None:
        if view.release.reason == ReleaseReason.FINISHED and not stale:
            # The done marker exists, even if a lagging cache (NFS negative lookups, up to
            # acdirmax) does not show it to us yet: taking over now would re-run a finished
            # shard.  After a TTL unchanged on our clock (TTL >= 3x cache time) the marker is
            # visible; if it really is gone, the shard is run again then.
            return None
        return TakeoverReason.RELEASED
    if view.failure is not None:
        return TakeoverReason.FAILED
    if holder_dead_here(view, identity):
        return TakeoverReason.HOLDER_DEAD
    return TakeoverReason.STALE if stale else None


def publish_claim(
    layout: JobLayout,
    view: LeaseView,
    identity: WorkerIdentity,
    attempt_id: str,
    reason: TakeoverReason,
) -> Claim | None:
    """Try to publish generation ``view.generation + 1``; the Claim if we won, None if not."""
    claim = Claim(
        shard_id=view.shard_id,
        generation=view.generation + 1,
        attempt_id=attempt_id,
        **asdict(identity),  # the claimer's whole identity: node, host, boot, pid namespace, pid
        claimed_at=time.time(),
        takeover_of=view.generation,
        takeover_reason=reason,
    )
    path = layout.claim(view.shard_id, claim.generation)
    confine.ensure_dir(layout, path.parent)
    if not fsio.publish_bytes(path, claim.encode()):
        return None  # another taker won this generation
    return claim


def release_claim(layout: JobLayout, claim: Claim, reason: ReleaseReason) -> bool:
    """Give up our generation so others may take over at once.  Idempotent: True when a
    release of our attempt is (now) recorded."""
    record = Release(claim.shard_id, claim.generation, claim.attempt_id, reason, time.time())
    path = layout.release(claim.shard_id, claim.generation)
    confine.ensure_dir(layout, path.parent)
    if fsio.publish_bytes(path, record.encode()):
        return True
    existing, _ = Release.read_or_error(path)  # released before (e.g. by the signal path): still ours
    return existing is not None and existing.attempt_id == claim.attempt_id


def release_or_warn(layout: JobLayout, claim: Claim, reason: ReleaseReason, what: str = "") -> None:
    """:func:`release_claim`, a write error only logged: the claim then goes stale after a TTL."""
    try:
        release_claim(layout, claim, reason)
    except OSError as exc:
        logger.warning(f"{what or claim.shard_id}: could not write the release record ({reason}): {exc}")


def newer_generation_exists(layout: JobLayout, claim: Claim) -> bool:
    """Advisory fencing check: someone took over after us."""
    return fsio.exists(layout.claim(claim.shard_id, claim.generation + 1))


def write_heartbeat(layout: JobLayout, claim: Claim, seq: int, *, make_dir: bool = True) -> None:
    """Rewrite the generation's heartbeat.  ``make_dir=False`` once its directory exists: a renewal
    is then one write (the directory is still checked with ``lstat``s the client answers from cache)."""
    path = layout.heartbeat(claim.shard_id, claim.generation)
    if make_dir:
        confine.ensure_dir(layout, path.parent)
    else:
        confine.check_inside(layout, path.parent)
    # Durable=False: a heartbeat lost in a crash only makes the claim look older, which is safe.
    fsio.atomic_write(
        path, Heartbeat(claim.shard_id, claim.generation, claim.attempt_id, seq, time.time()).encode(), durable=False
    )


class Heartbeater:
    """Renews one claim's heartbeat from a daemon thread; sets ``lost`` when renewal has failed for
    ``ttl - 2*heartbeat`` seconds or a newer generation exists.  :meth:`check` recomputes the
    deadline from the clock too, so a thread stuck in a hung NFS call cannot hide an expired lease."""

    def __init__(
        self,
        layout: JobLayout,
        claim: Claim,
        *,
        heartbeat_secs: float,
        ttl_secs: float,
        clock: Clock = time.monotonic,
        on_beat: Callable[[], object] | None = None,
        liveness: Liveness | None = None,
        on_stall: Callable[[str], object] | None = None,
    ):
        if not (0 < heartbeat_secs and 2 * heartbeat_secs < ttl_secs):
            raise ValueError("need 0 < heartbeat_secs < ttl_secs / 2")
        self.layout, self.claim = layout, claim
        self.heartbeat_secs, self.ttl_secs, self.clock = heartbeat_secs, ttl_secs, clock
        self.grace_secs = ttl_secs - 2 * heartbeat_secs
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self.seq = 0
        self.last_renewal = clock()
        # called after each successful renewal (live progress piggy-backs on the cadence);
        # it must not raise, and must be quick: the lease matters more than the display
        self.on_beat = on_beat
        # no renewal without signs of life; on_stall(reason) gives the shard up before the
        # liveness' own stall callbacks (the runner's restart) run
        self.liveness, self.on_stall = liveness, on_stall
        self._renewer = RenewThread(heartbeat_secs, self._renew, f"heartbeat-{claim.shard_id}")
        self._dir_ready = False  # the heartbeat directory exists: renewals need no makedirs

    def _lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            logger.warning(f"{self.claim.shard_id} gen {self.claim.generation}: lease lost ({reason})")
            self.lost.set()

    def beat(self) -> bool:
        """One renewal; True when it was written and the claim is still ours."""
        if self.lost.is_set():
            return False
        if self.liveness is not None and self.liveness.is_stalled():
            self._stalled(f"stalled: {self.liveness.describe()}")
            return False
        try:
            if newer_generation_exists(self.layout, self.claim):
                self._lose("a newer generation was claimed")
                return False
            self.seq += 1
            try:
                write_heartbeat(self.layout, self.claim, self.seq, make_dir=not self._dir_ready)
            except FileNotFoundError:  # its directory was removed (retry archives a shard's records)
                write_heartbeat(self.layout, self.claim, self.seq, make_dir=True)
            self._dir_ready = True
        except OSError as exc:
            logger.warning(f"{self.claim.shard_id}: heartbeat failed: {exc}")
            self.check()
            return False
        self.last_renewal = self.clock()
        if self.on_beat is not None:
            try:
                self.on_beat()
            except Exception as exc:
                logger.warning(f"{self.claim.shard_id}: heartbeat hook failed: {exc}")
        return True

    def _stalled(self, reason: str) -> None:
        self._lose(reason)
        if self.on_stall is not None:
            try:
                self.on_stall(reason)
            except Exception as exc:  # the lease then simply expires after a TTL
                logger.warning(f"{self.claim.shard_id}: could not give the stalled shard up: {exc}")
        self.liveness.declare_stalled()

    def check(self) -> bool:
        """True while the lease is held; sets ``lost`` once renewal is overdue."""
        if not self.lost.is_set() and self.clock() - self.last_renewal > self.grace_secs:
            self._lose(f"no renewal for more than {self.grace_secs:g}s")
        return not self.lost.is_set()

    def held(self) -> bool:
        """:meth:`check`, and no newer generation exists (someone took over after us)."""
        return self.check() and not newer_generation_exists(self.layout, self.claim)

    def _renew(self) -> bool:
        self.beat()
        return self.check()

    def start(self) -> Heartbeater:
        self._renewer.start()
        return self

    def stop(self) -> None:
        self._renewer.stop()
