"""The side files of a shard's rows: the per-row stats file (each output row's ``__dj__stats__`` /
``__dj__meta__``: Data-Juicer's ``<export>_stats.jsonl`` layout, docs/analysis.md) and the quarantine
file (each row an operator failed on, with why: docs/quarantine.md).  Each attempt writes its shard's
lines, the result record names the file with its size and sha256, and merge concatenates the accepted
files in manifest order beside the export, validated like the outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.jobdir.exports import check_published_file
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import RowErrorsFile, RowStatsFile, ShardEntry, ShardResult
from data_juicer_elastic.rows.jsonl import validate_jsonl_output
from data_juicer_elastic.sharedfs import fsio

ROW_STATS_FILE: Final = "row-stats.jsonl"  # an attempt's per-row stats file, in its attempt directory
ERRORS_FILE: Final = "errors.jsonl"  # an attempt's quarantine file, in its attempt directory
# Ray workers append their raw records here (one file per process); the runner folds them into ERRORS_FILE.
WORKER_DIR: Final = "quarantine"
ROW_KEY: Final = "row"  # always the last key of a line of the quarantine file: the row's own bytes end it
# The two columns of a row that go to the row stats file, as Data-Juicer names them
# (``data_juicer.utils.constant.Fields.stats`` / ``Fields.meta``; not imported: no Data-Juicer here).
STATS_FIELD: Final = "__dj__stats__"
META_FIELD: Final = "__dj__meta__"


def export_stats_path(export: Path) -> Path:
    """``merged.jsonl`` -> ``merged_stats.jsonl`` (Data-Juicer's name for it)."""
    return export_side_path(export, "_stats.jsonl")


def export_errors_path(export: Path) -> Path:
    """``merged.jsonl`` -> ``merged_errors.jsonl`` (named like Data-Juicer's ``_stats.jsonl``)."""
    return export_side_path(export, "_errors.jsonl")


def export_side_path(export: Path, suffix: str) -> Path:
    """A file beside the export: its name with ``.jsonl`` (or ``.json``) replaced by ``suffix``."""
    name = export.name
    for ending in (".jsonl", ".json"):
        if name.endswith(ending) and len(name) > len(ending):
            return export.with_name(name[: -len(ending)] + suffix)
    return export.with_name(name + suffix)


def _checked_lines(path: Path, what: str, shard: str) -> tuple[int, int, str]:
    """(lines, bytes, sha256) of an attempt's side file, made durable and checked as valid JSONL."""
    fsio.fsync_file(path)
    try:
        return validate_jsonl_output(path, str(path))
    except ValueError as exc:
        raise IntegrityError(f"invalid {what}: {exc}", where=f"shard {shard}") from None


def describe_row_stats(layout: JobLayout, path: Path, rows: int, shard: str) -> RowStatsFile:
    """The record of an attempt's row stats file, made durable and checked: one line per output row."""
    lines, size, sha = _checked_lines(path, "row stats file", shard)
    if lines != rows:
        raise IntegrityError(f"the row stats file has {lines} lines for {rows} output rows", where=f"shard {shard}")
    return RowStatsFile(layout.relative(path), size, sha)


def describe_row_errors(layout: JobLayout, path: Path, shard: str) -> RowErrorsFile:
    """The record of an attempt's quarantine file, made durable and checked."""
    return RowErrorsFile(layout.relative(path), *_checked_lines(path, "quarantine file", shard))


@dataclass(frozen=True)
class MergedSideFile:
    """A file the merge published beside the export: this one (``<export>_stats.jsonl``) or the
    quarantine file (``<export>_errors.jsonl``)."""

    path: Path
    rows: int
    bytes: int
    sha256: str
    written: bool  # False when an identical file was already there


@dataclass(frozen=True)
class QuarantineRecord:
    """One quarantined row, everything but the row itself."""

    row_number: int | None  # global input row number
    shard: str
    shard_row: int | None  # the row's number within its shard
    op: str
    op_index: int | None
    error_type: str
    error: str

    def describe(self) -> str:
        """``op[1] my_mapper: ValueError: bad value (row 1234)``: the error as one line."""
        op = f"op[{self.op_index}] {self.op}" if self.op_index is not None else self.op
        row = f"row {self.row_number}" if self.row_number is not None else "a row made by an operator"
        first = self.error.strip().splitlines()[0] if self.error.strip() else ""
        return f"{op}: {self.error_type}{': ' + first if first else ''} ({row})"


def encode_line(error: QuarantineRecord, row: bytes) -> bytes:
    """One line of the file: the fields, then ``row`` (a JSON object's bytes, kept as they are)."""
    head = orjson.dumps(error)  # its fields in declaration order: the file's keys, in their order
    return head[:-1] + b',"' + ROW_KEY.encode() + b'":' + row + b"}\n"


def parse_line(line: bytes) -> tuple[QuarantineRecord, Any]:
    """(the error, the row as parsed) of one line; ValueError when it is not one."""
    value = orjson.loads(line)
    if not isinstance(value, dict) or ROW_KEY not in value:
        raise ValueError("not a quarantine record")
    error = QuarantineRecord(
        row_number=value.get("row_number"),
        shard=str(value.get("shard")),
        shard_row=value.get("shard_row"),
        op=str(value.get("op")),
        op_index=value.get("op_index"),
        error_type=str(value.get("error_type")),
        error=str(value.get("error")),
    )
    return error, value[ROW_KEY]


def read_errors(path: Path) -> Iterator[tuple[QuarantineRecord, Any]]:
    with fsio.open_read(path) as handle:
        for line in handle:
            if line.strip():
                yield parse_line(line)


def check_row_errors_file(
    layout: JobLayout,
    entry: ShardEntry,
    result: ShardResult,
    requeue: str,
    sink: Callable[[bytes], None] | None = None,
) -> int:
    """Re-check an accepted result's quarantine file against its record; its rows (0: none)."""
    record = result.errors
    if record is None:
        return 0
    expected = (record.rows, record.bytes, record.sha256)
    check_published_file(
        layout,
        entry,
        result,
        what="quarantine file",
        relative=record.path,
        expected=expected,
        requeue=requeue,
        sink=sink,
    )
    return record.rows
