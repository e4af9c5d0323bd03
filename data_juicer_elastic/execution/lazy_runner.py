"""A ShardRunner that starts its warm Ray runtime when the worker is about to claim: a worker with
nothing to claim costs no Ray start, and one that fails while Ray starts, or runs other operator code
(``code_fingerprint``), holds no claim.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from data_juicer_elastic.execution.code_fingerprint import check_code, code_fingerprint
from data_juicer_elastic.execution.ray_runtime import LOCAL, WarmRayRuntime
from data_juicer_elastic.execution.runtime_watch import RuntimeWatch
from data_juicer_elastic.execution.shard_runner import ShardRunner, shard_runtime_env
from data_juicer_elastic.jobdir import heartbeats
from data_juicer_elastic.jobdir.attempts import ShardOutput, ShardTask
from data_juicer_elastic.rows.shard_source import ShardSource
from data_juicer_elastic.settings import DEFAULT_MAX_ERROR_ROWS


class LazyShardRunner:
    """Context manager and ``run_shard`` callable; closing stops the runtime it started.  ``code``: the
    job's code fingerprint, checked before each runtime start (None: not checked)."""

    def __init__(
        self,
        recipe: dict[str, Any],
        expected_stage_identities: list[str],
        cache_dir: Path,
        *,
        row_schema: list[Any] | None | Callable[[], list[Any] | None],
        ray_address: str = LOCAL,
        ray_num_cpus: int | None = None,
        code: dict[str, Any] | None = None,
        allow_version_mismatch: bool = False,
        restart_process: Callable[[], object] | None = None,
        max_error_rows: float = DEFAULT_MAX_ERROR_ROWS,
    ):
        self._recipe, self._code, self._allow_versions = recipe, code, allow_version_mismatch
        self._restart_process = restart_process
        self._starting = threading.Lock()  # one start at a time: early, or before a claim
        self._closed = threading.Event()  # ends the thread that started the runtime early
        self._runner = ShardRunner(
            recipe, expected_stage_identities, cache_dir, row_schema=row_schema, max_error_rows=max_error_rows
        )
        self.runtime = WarmRayRuntime(ray_address, ray_num_cpus, runtime_env=shard_runtime_env(recipe, Path(cache_dir)))

    @property
    def starting(self) -> bool:
        return self._starting.locked() and not self.runtime.started

    def __enter__(self) -> LazyShardRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def ready(self) -> bool:
        """Check the code and start the runtime unless running (waiting for a start under way);
        True when it had to: that took seconds, the caller looks at its shard again.  Raises
        ElasticError (CodeMismatchError, RayConnectionError) rather than claiming or hanging."""
        with self._starting:
            if self.runtime.started:
                return False
            if self._code is not None:
                here = code_fingerprint(self._recipe)
                check_code(self._code, here, allow_version_mismatch=self._allow_versions)
            self.runtime.start()
            return True

    def start_early(self) -> None:
        """Start the runtime on a thread now (while the job is scanned), so the first shard does
        not wait for it.  A failure is only logged here: :meth:`ready`, called before the first
        claim, tries again and raises it.  The thread lives until :meth:`close`: Ray's node
        processes are started with a parent-death signal, which Linux sends when the *thread*
        that started them ends (seen with Ray 2.60: the runtime died a minute after its
        starting thread returned)."""

        def start() -> None:
            try:
                self.ready()
            except Exception as exc:  # noqa: BLE001 - ready() raises it again where it matters
                logger.warning(f"starting Ray early failed ({type(exc).__name__}: {exc}); tried again before a claim")
                return
            self._closed.wait()

        threading.Thread(target=start, name="dj-elastic-ray-start", daemon=True).start()

    def read_ahead(self, source: ShardSource) -> Any:
        return self._runner.read_ahead(source)

    def __call__(self, task: ShardTask) -> ShardOutput:
        self.ready()  # idempotent; the worker loop normally did it before claiming
        tracker = heartbeats.current()  # the worker loop's live progress of this attempt, with its stall rule
        alive = tracker.liveness if tracker is not None else None
        with RuntimeWatch(self.runtime, alive, self._restart_process):
            return self._runner(task)

    def close(self) -> None:
        try:
            self._runner.close()  # its warm actors live in the runtime: free them first
        finally:
            try:
                with self._starting:  # a start under way (start_early) ends first: ray.init is not interruptible
                    self.runtime.close()
            finally:
                self._closed.set()
