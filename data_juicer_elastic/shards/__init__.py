"""The data path, shard level: the input into shards on the way in, shard outputs into one
file on the way out.

``ingest`` (prepare's passes over the input) -> ``splitter`` (exactly n contiguous shards) ->
``prepare`` (publish the manifest last); ``merge`` (validated, ordered, idempotent),
``stream_merge`` (the finished prefix published while shards complete, its files and their
lock in ``partial_files``) and ``parts`` (the
accepted outputs published as a directory of ordered parts, without copying); ``verify`` (a
finished job checked without writing) with ``export_check`` (its export, either layout);
``steps`` (how far a long local step is).  Built on ``rows`` and
the ``jobdir`` protocol; no Ray, no Data-Juicer imports.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "export_check",
    "ingest",
    "merge",
    "partial_files",
    "parts",
    "prepare",
    "splitter",
    "steps",
    "stream_merge",
    "verify",
]
