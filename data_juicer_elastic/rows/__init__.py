"""The data path, row level: how a JSONL row is read, judged, typed and compressed.

``codecs`` (plain/gzip/zstd files, reader and writer threads), ``line_framer`` (bytes -> whole lines),
``row_policy`` (what one JSON object per line means), ``jsonl`` (row normalisation, output validation),
``row_schema`` (the JSON type of every key), ``row_checkers`` (row validation in helper processes),
``shard_source`` (a shard's rows read from its inputs or its copy, checked against its scan).  Depends only on
``sharedfs``.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "codecs",
    "jsonl",
    "line_framer",
    "row_checkers",
    "row_policy",
    "row_schema",
    "shard_source",
]
