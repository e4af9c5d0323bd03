"""The per-row stats file: each output row's ``__dj__stats__`` / ``__dj__meta__`` (Data-Juicer's
``<export>_stats.jsonl`` layout, docs/analysis.md).  Each attempt writes its shard's lines, the
result record names the file with its size and sha256, and merge concatenates the accepted files in
manifest order, validated like the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.result_records import RowStatsFile
from data_juicer_elastic.rows.jsonl import validate_jsonl_output
from data_juicer_elastic.sharedfs import fsio

ATTEMPT_FILE: Final = "row-stats.jsonl"
# The two columns of a row that go to this file, as Data-Juicer names them
# (``data_juicer.utils.constant.Fields.stats`` / ``Fields.meta``; not imported: no Data-Juicer here).
STATS_FIELD: Final = "__dj__stats__"
META_FIELD: Final = "__dj__meta__"


def export_stats_path(export: Path) -> Path:
    """``merged.jsonl`` -> ``merged_stats.jsonl`` (Data-Juicer's name for it)."""
    return export_side_path(export, "_stats.jsonl")


def export_side_path(export: Path, suffix: str) -> Path:
    """A file beside the export: its name with ``.jsonl`` (or ``.json``) replaced by ``suffix``."""
    name = export.name
    for ending in (".jsonl", ".json"):
        if name.endswith(ending) and len(name) > len(ending):
            return export.with_name(name[: -len(ending)] + suffix)
    return export.with_name(name + suffix)


def describe_row_stats(layout: JobLayout, path: Path, rows: int, shard: str) -> RowStatsFile:
    """The record of an attempt's row stats file, made durable and checked: one line per output row."""
    fsio.fsync_file(path)
    try:
        lines, size, sha = validate_jsonl_output(path, str(path))
    except ValueError as exc:
        raise IntegrityError(f"invalid row stats file: {exc}", where=f"shard {shard}") from None
    if lines != rows:
        raise IntegrityError(f"the row stats file has {lines} lines for {rows} output rows", where=f"shard {shard}")
    return RowStatsFile(layout.relative(path), size, sha)


@dataclass(frozen=True)
class MergedSideFile:
    """A file the merge published beside the export: this one (``<export>_stats.jsonl``) or the
    quarantine file (``<export>_errors.jsonl``, jobdir.row_errors)."""

    path: Path
    rows: int
    bytes: int
    sha256: str
    written: bool  # False when an identical file was already there
