"""The data path, shard level: the input into shards on the way in, shard outputs into one export.

``plan`` (inputs cut into shards at line ends, reading only around the cuts) -> ``prepare`` (publish the plan) ->
``scan`` (one shard read once: rows checked, row schema, hash, copy); ``merge`` (validated, ordered, idempotent),
``stream_merge`` (the finished prefix published while shards complete; its files and lock in ``partial_files``),
``parts`` (a directory of ordered parts, without copying); ``verify`` (a finished job checked) with
``export_check`` (its export); ``clean`` (a verified job's shard outputs removed, its export kept); ``steps``
(progress of long local steps).  Built on ``rows`` and ``jobdir``; no Ray, no Data-Juicer imports.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "clean",
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
