"""The data path, shard level: the input into shards on the way in, shard outputs into one
file on the way out.

``plan`` (the inputs listed and cut into n shards at line ends, reading only around the cuts) ->
``prepare`` (publish the plan) -> ``scan`` (one shard's bytes read once: every row checked, its
row schema, its hash and, with copy_shards, its copy; run by every worker); ``merge`` (validated,
ordered, idempotent), ``stream_merge`` (the finished prefix published while shards complete, its
files and their lock in ``partial_files``) and ``parts`` (the accepted outputs published as a
directory of ordered parts, without copying); ``verify`` (a finished job checked without writing)
with ``export_check`` (its export, either layout); ``steps`` (how far a long local step is).
Built on ``rows`` and the ``jobdir`` protocol; no Ray, no Data-Juicer imports.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "export_check",
    "merge",
    "partial_files",
    "parts",
    "plan",
    "prepare",
    "scan",
    "steps",
    "stream_merge",
    "verify",
]
