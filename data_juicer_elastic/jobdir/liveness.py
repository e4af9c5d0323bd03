"""Is a running attempt alive?  A heartbeat must mean progress, not just a living process.

A worker renews its lease from a thread whatever its runtime does: with the Ray processes
frozen (SIGSTOP, a hung raylet) a shard would stay ``running`` with a fresh heartbeat for ever.
So the holder renews only while the attempt shows *signs of life*: its live progress changed
(``jobdir.progress``), or its runtime answered a probe (``execution.runtime_watch`` sends one
when the progress has been quiet for a quarter of the timeout: a long block is not a stall).
When neither happened for ``stall_timeout_secs`` (holder's monotonic clock, checked at every
heartbeat), the heartbeat thread gives the shard up (a ``stalled`` failure record, a holder
death, and a release), stops renewing, and calls the ``when_stalled`` callbacks (the Ray runner
restarts the worker with a fresh runtime); the attempt can no longer publish (self-fencing).

The rule applies only while the runner runs (``armed``): publishing is the worker's own work.
It does not catch an operator stuck on a healthy runtime (docs/failure-semantics.md).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from loguru import logger

Clock = Callable[[], float]


class Liveness:
    """Signs of life of one attempt, and what to do when there are none for too long."""

    def __init__(self, stall_secs: float, clock: Clock = time.monotonic):
        if not stall_secs > 0:
            raise ValueError("stall_secs must be > 0")
        self.stall_secs, self.clock = stall_secs, clock
        self._last, self._what = clock(), "the attempt started"
        self._armed = False
        self.stalled = threading.Event()
        self._callbacks: list[Callable[[], object]] = []
        self._lock = threading.Lock()

    def note(self, what: str) -> None:
        """A sign of life (any thread)."""
        self._last, self._what = self.clock(), what

    @contextlib.contextmanager
    def armed(self) -> Iterator[Liveness]:
        """Apply the stall rule while the block (the runner) runs."""
        self.note("the runner started")
        self._armed = True
        try:
            yield self
        finally:
            self._armed = False

    def quiet_for(self) -> float:
        return max(0.0, self.clock() - self._last)

    def is_stalled(self) -> bool:
        return self._armed and self.quiet_for() > self.stall_secs

    def describe(self) -> str:
        return f"no sign of life for {self.quiet_for():.0f}s (limit {self.stall_secs:g}s; last: {self._what})"

    def when_stalled(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` (from the heartbeat thread) once the attempt is declared stalled."""
        with self._lock:
            fire = self.stalled.is_set()
            if not fire:
                self._callbacks.append(callback)
        if fire:
            _call(callback)

    def declare_stalled(self) -> None:
        with self._lock:
            if self.stalled.is_set():
                return
            self.stalled.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _call(callback)


def _call(callback: Callable[[], object]) -> None:
    try:
        callback()
    except Exception as exc:  # giving the shard up must not depend on a restart succeeding
        logger.warning(f"stall handler failed: {type(exc).__name__}: {exc}")
