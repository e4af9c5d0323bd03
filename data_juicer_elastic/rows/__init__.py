"""The data path, row level: how a JSONL row is read, judged, typed and compressed.
Depends only on ``sharedfs``.
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
