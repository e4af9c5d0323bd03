"""A ShardRunner that starts its warm Ray runtime on the first shard it gets.

A worker that finds nothing to claim (a finished job, a late node) then costs
no Ray start.  The runtime is started with the recipe's runtime env (custom
operator modules, model caches) and reused for every later shard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_juicer_elastic.execution.ray_runtime import DEFAULT_CONNECT_TIMEOUT_SECS, LOCAL, WarmRayRuntime
from data_juicer_elastic.execution.shard_runner import ShardRunner, shard_runtime_env
from data_juicer_elastic.jobdir.tasks import ShardOutput, ShardTask


class LazyShardRunner:
    """Context manager and ``run_shard`` callable; closing stops the runtime it started."""

    def __init__(
        self,
        recipe: dict[str, Any],
        expected_stage_identities: list[str],
        cache_dir: Path,
        *,
        row_schema: list[Any] | None,
        ray_address: str = LOCAL,
        ray_num_cpus: int | None = None,
        connect_timeout_secs: float = DEFAULT_CONNECT_TIMEOUT_SECS,
    ):
        self._runner = ShardRunner(recipe, expected_stage_identities, cache_dir, row_schema=row_schema)
        self._runtime = WarmRayRuntime(
            ray_address,
            ray_num_cpus,
            runtime_env=shard_runtime_env(recipe, Path(cache_dir)),
            connect_timeout_secs=connect_timeout_secs,
        )

    @property
    def runtime(self) -> WarmRayRuntime:
        return self._runtime

    def __enter__(self) -> LazyShardRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __call__(self, task: ShardTask) -> ShardOutput:
        self._runtime.start()  # idempotent; raises ElasticError rather than hanging
        return self._runner(task)

    def close(self) -> None:
        self._runtime.close()
