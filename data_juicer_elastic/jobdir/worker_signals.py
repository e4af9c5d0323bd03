"""SIGTERM/SIGINT while a worker runs: handed back as an exception in the main thread, so the
worker loop can release its claim (no shard waits a TTL for nothing), then honoured as the
signal would have been."""

from __future__ import annotations

import os
import signal
import threading
import time

from data_juicer_elastic.errors import WorkerInterrupted


class SignalGuard:
    """Turns SIGTERM/SIGINT into WorkerInterrupted while the loop runs (main thread only)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.previous: dict[int, object] = {}
        self.pending: int | None = None

    def _handler(self, signum: int, frame: object) -> None:
        if self.pending is None:  # a second signal while we clean up is absorbed
            self.pending = signum
            raise WorkerInterrupted(signum)

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                previous = signal.getsignal(sig)
                if previous is signal.SIG_IGN:
                    continue  # the parent asked us to ignore it; keep doing so
                self.previous[sig] = previous
                signal.signal(sig, self._handler)
        return self

    def restore(self) -> None:
        for sig, previous in self.previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)

    def __exit__(self, *exc_info: object) -> None:
        self.restore()


def is_guard_handler(handler: object) -> bool:
    """Whether ``handler`` is a SignalGuard's: what a library that installs its own SIGTERM
    handler (Ray, at every ``ray.init``) must leave in place (``compat.ray_sigterm_handler``)."""
    return getattr(handler, "__func__", None) is SignalGuard._handler


def honour(guard: SignalGuard, signum: int) -> None:
    """Restore the previous handlers and do what the signal would have done without us."""
    guard.restore()
    previous = guard.previous.get(signum)
    if callable(previous):
        previous(signum, None)  # e.g. default_int_handler raises KeyboardInterrupt
        return
    if previous in (signal.SIG_DFL, None):
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # terminates with the signal's status, as the scheduler expects
        time.sleep(1.0)
    raise SystemExit(128 + signum)
