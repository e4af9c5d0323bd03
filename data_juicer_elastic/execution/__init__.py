"""Running one claimed shard: a warm node-local Ray runtime, Data-Juicer's RayExecutor per shard.
Data-Juicer and Ray internals are reached through ``compat``; importing this imports neither.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "code_fingerprint",
    "dedup_ops",
    "dedup_runner",
    "progress_source",
    "ray_runtime",
    "row_writer",
    "shard_reader",
    "shard_runner",
    "stage_identities",
    "warm_ops",
]
