"""Heartbeats on shared storage: the one staleness rule (on the observer's own monotonic clock:
docs/leases-on-nfs.md, item 2) and the one renew thread, for shard leases and phase leaders.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import NamedTuple, Protocol

Clock = Callable[[], float]


class Watched(Protocol):
    """One read of a heartbeat: which heartbeat (``watch_key``) and the value watched for change."""

    @property
    def watch_key(self) -> str: ...

    @property
    def watch_token(self) -> Hashable: ...


class Sighting(NamedTuple):
    """A :class:`Watched` for records that are not a lease view (a phase leader's heartbeat)."""

    watch_key: str
    watch_token: Hashable


class StalenessObserver:
    """Judges staleness on this observer's own clock (the Kubernetes leader-election rule)."""

    def __init__(self, ttl_secs: float, clock: Clock = time.monotonic):
        if ttl_secs <= 0:
            raise ValueError("ttl_secs must be > 0")
        self.ttl_secs = ttl_secs
        self.clock = clock
        self._seen: dict[str, tuple[Hashable, float]] = {}  # key -> (token, first seen on our clock)

    def observe(self, seen: Watched) -> float:
        """Record the sighting; return for how long (our clock) its value has been unchanged."""
        now = self.clock()
        previous = self._seen.get(seen.watch_key)
        if previous is None or previous[0] != seen.watch_token:
            self._seen[seen.watch_key] = (seen.watch_token, now)
            return 0.0
        return max(0.0, now - previous[1])

    def unchanged_for(self, key: str) -> float | None:
        """For how long (our clock) the last value seen for ``key`` has been unchanged; None when
        never observed.  Lets a claimer skip re-reading a held shard that could not be stale yet."""
        previous = self._seen.get(key)
        return None if previous is None else max(0.0, self.clock() - previous[1])

    def is_stale(self, seen: Watched) -> bool:
        """The heartbeat's value has not changed for ``ttl_secs`` on our clock (observes it too)."""
        return self.observe(seen) >= self.ttl_secs

    def forget(self, key: str) -> None:
        self._seen.pop(key, None)


class RenewThread:
    """Calls ``renew()`` at start, then every ``interval_secs`` from a daemon thread, until
    :meth:`stop` or until ``renew()`` returns False (the heartbeat is not ours any more)."""

    def __init__(self, interval_secs: float, renew: Callable[[], bool], name: str):
        self.interval_secs, self.renew, self.name = interval_secs, renew, name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.renew()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_secs):
            if not self.renew():
                return

    def stop(self) -> None:
        """Stop renewing; waits a little for a renewal in flight (never for the calling thread)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(1.0, self.interval_secs))


def looks_stale(age_secs: float | None, ttl_secs: object) -> bool:
    """The heartbeat file's mtime age is over the TTL: a display hint for readers without an
    observer, never a takeover's reason (mtimes come through caches, from the server's clock)."""
    return isinstance(ttl_secs, (int, float)) and age_secs is not None and age_secs > ttl_secs
