"""The per-row stats file: each output row's ``__dj__stats__`` / ``__dj__meta__``, beside the export.

Data-Juicer's exporter (``core/exporter.py``, default executor) writes every row's stats
and meta to ``<export>_stats.jsonl``, one line per output row, in row order, and keeps them
out of the rows unless ``keep_stats_in_res_ds``; ``dj-analyze`` and downstream tools expect
that layout.  Here each attempt writes its shard's lines (``row-stats.jsonl``, next to
``output.jsonl``), the result record names the file with its size and sha256, and merge
concatenates the accepted files in manifest order, validated like the outputs.

The file exists only when the recipe makes stats or meta (a Filter or a tagging operator),
as with Data-Juicer.  Its name: the export's name with ``.jsonl`` (or ``.json``) replaced by
``_stats.jsonl``; Data-Juicer replaces that text anywhere in the path, which differs only
for directory names holding ``.jsonl``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.jobdir import confine, fsio
from data_juicer_elastic.jobdir.jsonl import validate_jsonl_output
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import RowStatsFile, ShardEntry, ShardResult

ATTEMPT_FILE: Final = "row-stats.jsonl"


def export_stats_path(export: Path) -> Path:
    """``merged.jsonl`` -> ``merged_stats.jsonl`` (Data-Juicer's name for it)."""
    name = export.name
    for suffix in (".jsonl", ".json"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return export.with_name(name[: -len(suffix)] + "_stats.jsonl")
    return export.with_name(name + "_stats.jsonl")


def describe(layout: JobLayout, path: Path, rows: int, shard: str) -> RowStatsFile:
    """The record of an attempt's row stats file, made durable and checked: one line per output row."""
    fsio.fsync_file(path)
    try:
        lines, size, sha = validate_jsonl_output(path, str(path))
    except ValueError as exc:
        raise IntegrityError(f"invalid row stats file: {exc}", where=f"shard {shard}") from None
    if lines != rows:
        raise IntegrityError(f"the row stats file has {lines} lines for {rows} output rows", where=f"shard {shard}")
    return RowStatsFile(layout.relative(path), size, sha)


def copy_row_stats(
    layout: JobLayout, entry: ShardEntry, result: ShardResult, sink: Callable[[bytes], None]
) -> tuple[int, int]:
    """Validate an accepted result's row stats file against its record while copying it; (rows, bytes)."""
    record = result.row_stats
    if record is None:
        return 0, 0
    where = f"shard {entry.shard_id}"
    try:
        path = layout.resolve_relative(record.path)
    except Exception as exc:  # noqa: BLE001 - JobDirError from a forged path: name the shard
        raise IntegrityError(f"bad row stats path {record.path!r}: {exc}", where=where) from None
    own = layout.attempt_dir(entry.shard_id, result.attempt_id)
    if own not in path.parents:
        raise IntegrityError(
            f"done marker names row stats {record.path}, outside its attempt directory",
            where=where,
            hint="the job directory was modified; prepare a new job_dir",
        )
    confine.check_inside(layout, path)
    try:
        rows, size, sha = validate_jsonl_output(path, str(path), sink)
    except FileNotFoundError:
        raise IntegrityError(f"accepted row stats file {path} is missing", where=where) from None
    except ValueError as exc:
        raise IntegrityError(f"accepted row stats file is corrupt: {exc}", where=where) from None
    if (rows, size, sha) != (result.rows, record.bytes, record.sha256):
        raise IntegrityError(
            f"accepted row stats file does not match its record: expected rows={result.rows} bytes={record.bytes} "
            f"sha256={record.sha256}, found rows={rows} bytes={size} sha256={sha}",
            where=where,
            hint=f"{path} was modified after publication; prepare a new job to recompute it",
        )
    return rows, size


@dataclass(frozen=True)
class MergedRowStats:
    path: Path
    rows: int
    bytes: int
    sha256: str
    written: bool
