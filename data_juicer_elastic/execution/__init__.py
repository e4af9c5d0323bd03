"""Running one claimed shard: a warm node-local Ray runtime, Data-Juicer's RayExecutor per shard.

* the runtime: ``ray_runtime`` (one warm Ray per worker process), ``lazy_runner`` (started
  when the worker is about to claim), ``runtime_watch`` (the Ray half of the stall rule);
* one shard: ``shard_runner`` (RayExecutor on the shard, the runner the worker loop calls),
  ``stage_identities`` (the recipe's stage ids, as RayExecutor computes them),
  ``code_fingerprint`` (one version of the operators' code per job), ``progress_source``
  (live progress from Ray Data's metrics);
* rows in and out, losslessly: ``shard_reader`` (the shard read with the job's row schema),
  ``row_types`` (that schema in Arrow), ``row_writer`` (every row once, in order) and
  ``lossless`` (untouched values exactly as read);
* warm operators: ``warm_ops`` (operators built once per process), ``warm_actors``
  (long-lived actors for actor-mode operators).

Private helpers: ``_dj_config`` (the shard recipe through Data-Juicer's parser),
``_shard_source`` (the shard handed to Data-Juicer's loader), ``_attempt_log``.  Every
Data-Juicer or Ray internal they need is reached through ``compat``.  Importing this
package is cheap and imports neither Ray nor Data-Juicer.
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
