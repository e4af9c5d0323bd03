"""Running one claimed shard: a warm node-local Ray runtime, Data-Juicer's RayExecutor per shard.

Modules (import them directly; importing this package is cheap and imports
neither Ray nor Data-Juicer):

- ``ray_runtime.WarmRayRuntime``: one Ray runtime per worker process.
- ``shard_runner.ShardRunner``: ``run_shard`` for the worker loop.
- ``lazy_runner.LazyShardRunner``: a ShardRunner that starts Ray on first use.
- ``stage_identities.compute_stage_identities``: the recipe's stage ids, as a Ray run computes them.
"""
