"""Is a running attempt alive?  The holder renews its heartbeat only while the attempt shows signs
of life (rules: docs/failure-semantics.md, "A heartbeat means progress (the stall rule)").
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
