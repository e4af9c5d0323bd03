"""The Ray runner's half of the stall rule (``jobdir.liveness``): probe the runtime while a shard's
progress is quiet, and restart the worker when the shard was given up.  Rules, and why a restart
is a new process and not a new runtime: docs/failure-semantics.md, "A heartbeat means progress".
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Final

from loguru import logger

from data_juicer_elastic.errors import EXIT_ERROR
from data_juicer_elastic.execution.ray_runtime import WarmRayRuntime
from data_juicer_elastic.jobdir.heartbeats import Liveness

QUIET_FRACTION: Final = 0.25  # probe once the attempt was quiet for this part of the stall timeout
MIN_TICK_SECS: Final = 0.5
RESTARTS_ENV: Final = "DJ_ELASTIC_RUNTIME_RESTARTS"  # restarts so far of this worker (kept across exec)
MAX_RESTARTS: Final = 5  # then the worker stops (exit 2): a node whose runtime keeps freezing is broken


class RuntimeWatch:
    """Context manager around one attempt of the Ray runner; a no-op without a liveness.
    ``restart_process()`` replaces this process after the frozen runtime was killed."""

    def __init__(
        self, runtime: WarmRayRuntime, liveness: Liveness | None, restart_process: Callable[[], object] | None = None
    ):
        self.runtime, self.liveness = runtime, liveness
        self.restart_process = restart_process or restart_worker_process
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
        """The shard was given up (heartbeat thread): kill the runtime, start the worker afresh."""
        self._halt.set()
        logger.error("the shard's Ray runtime stopped answering: killing it and restarting the worker")
        self.runtime.abort()
        self.restart_process()

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


def restart_worker_process(before: Callable[[], object] | None = None) -> None:
    """Replace this process with a fresh run of its own command line (same pid, same
    environment), or stop it (exit 2) after :data:`MAX_RESTARTS` restarts."""
    count = int(os.environ.get(RESTARTS_ENV, "0") or 0) + 1
    if before is not None:
        try:
            before()
        except Exception as exc:  # noqa: BLE001 - the restart matters more
            logger.warning(f"before restarting: {exc}")
    if count > MAX_RESTARTS:
        print(
            f"error: the Ray runtime of this worker froze {count} times; its shards were given up "
            "(check the node: memory, disk, a hung GPU), then start the worker again",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_ERROR)
    os.environ[RESTARTS_ENV] = str(count)
    argv = list(sys.orig_argv)
    logger.error(f"restarting this worker ({count}/{MAX_RESTARTS}) with a fresh Ray runtime: {' '.join(argv)}")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os.execv(sys.executable, argv)
