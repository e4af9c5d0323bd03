"""The Ray runner's half of the stall rule (``jobdir.liveness``): probe the runtime while a
shard's progress is quiet, and restart the runtime when the shard was given up.

Ray Data counts rows when a task finishes a block, so a long block on a healthy runtime
shows no progress for a while.  Once the attempt has been quiet for a quarter of the
stall timeout, a probe thread asks the runtime to run a zero-CPU task
(``WarmRayRuntime.ping``, at most one in flight, again every quarter of the timeout while
it stays quiet); an answer is a sign of life.  A frozen runtime (its processes stopped, a
hung raylet) answers nothing and makes no progress, so the heartbeat thread gives the
shard up after the timeout and then calls :meth:`RuntimeWatch.restart`: the runtime's
processes are killed and this process disconnects, which makes the shard's blocked
Ray call in the main thread return (Ray raises ``SystemExit`` there); the runner turns that
into ``ShardStalledError`` and the next claim starts a fresh runtime (``LazyShardRunner``).

Probing only when quiet keeps a healthy shard free of extra Ray tasks: with a lone CPU a
probe may need a worker process of its own, which Ray starts, and later stops, each time.
"""

from __future__ import annotations

import threading
from typing import Final

from loguru import logger

from data_juicer_elastic.execution.ray_runtime import WarmRayRuntime
from data_juicer_elastic.jobdir.liveness import Liveness

QUIET_FRACTION: Final = 0.25  # probe once the attempt was quiet for this part of the stall timeout
MIN_TICK_SECS: Final = 0.5


class RuntimeWatch:
    """Context manager around one attempt of the Ray runner; a no-op without a liveness."""

    def __init__(self, runtime: WarmRayRuntime, liveness: Liveness | None):
        self.runtime, self.liveness = runtime, liveness
        self.restarted = False
        self._halt = threading.Event()
        self._probing = threading.Lock()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RuntimeWatch:
        if self.liveness is not None:
            self.liveness.when_stalled(self.restart)
            self._thread = threading.Thread(target=self._run, name="dj-elastic-runtime-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def restart(self) -> None:
        """The shard was given up (heartbeat thread): kill and disconnect the runtime."""
        self.restarted = True
        self._halt.set()
        logger.error("the shard's runtime stopped answering: restarting the Ray runtime")
        self.runtime.abort()

    def _run(self) -> None:
        assert self.liveness is not None
        quiet = self.liveness.stall_secs * QUIET_FRACTION
        tick = max(MIN_TICK_SECS, quiet / 4)
        while not self._halt.wait(tick):
            if self.liveness.quiet_for() >= quiet and self._probing.acquire(blocking=False):
                threading.Thread(target=self._probe, name="dj-elastic-runtime-probe", daemon=True).start()

    def _probe(self) -> None:
        try:
            assert self.liveness is not None
            if self.runtime.started and self.runtime.ping(self.liveness.stall_secs):
                self.liveness.note("the Ray runtime answered a probe")
        finally:
            self._probing.release()
