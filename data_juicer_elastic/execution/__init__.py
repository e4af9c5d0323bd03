"""Running one claimed shard: a warm node-local Ray runtime, Data-Juicer's RayExecutor per shard.

* the runtime: ``ray_runtime`` (one per worker process), ``lazy_runner`` (started before a
  claim), ``runtime_watch`` (the Ray half of the stall rule);
* one shard: ``shard_runner`` (the runner the worker loop calls), ``stage_identities``,
  ``code_fingerprint`` (one version of the operators' code per job), ``progress_source``;
* rows in and out, losslessly: ``shard_reader``, ``row_types`` (the row schema in Arrow),
  ``row_writer`` and ``lossless`` (untouched values exactly as read);
* warm operators: ``warm_ops`` and ``warm_actors`` (for actor-mode operators).

Private: ``_dj_config`` (Data-Juicer's parser), ``_shard_source`` (its loader), ``_attempt_log``.
Data-Juicer and Ray internals are reached through ``compat``; importing this imports neither.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "code_fingerprint",
    "lazy_runner",
    "lossless",
    "progress_source",
    "ray_runtime",
    "row_types",
    "row_writer",
    "runtime_watch",
    "shard_reader",
    "shard_runner",
    "stage_identities",
    "warm_actors",
    "warm_ops",
]
