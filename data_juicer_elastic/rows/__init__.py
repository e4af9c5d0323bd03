"""The data path, row level: how a JSONL row is read, judged, typed and compressed.

``codecs`` (plain/gzip/zstd files, streaming reads that hash as they go), ``line_framer``
(bytes -> whole lines, the one place a line is split across chunks), ``row_policy`` (what one
JSON object per line means, the same for every parser), ``jsonl`` (row normalisation in
blocks, shard-output validation), ``row_schema`` (the JSON type of every key over the whole
input), ``row_checkers`` (row validation in helper processes), ``shard_source`` (a shard's
rows read from its byte ranges of the inputs or from its copy, checked against its scan).
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
