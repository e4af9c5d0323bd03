"""Write a processed shard: every row once, in input order, each untouched value as it was read,
in Data-Juicer's export layout, its bytes depending only on the row.  Why not Ray's JSON writer,
and the encoding: docs/lossless.md.

Lossless: the writer compares each output row with its input row (``ROW_COLUMN``): a value
:func:`equivalent` to the input's is written as the input had it, anything else as the operator made
it (what Arrow changed and no operator did is put back).  The rules (equivalence, null vs absent,
key order): docs/lossless.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from math import copysign
from pathlib import Path
from typing import Any, Final

import orjson

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.execution.shard_reader import ROW_COLUMN, InputRows
from data_juicer_elastic.jobdir.exports import META_FIELD, STATS_FIELD
from data_juicer_elastic.rows.row_schema import MAX_TYPED_DEPTH
from data_juicer_elastic.sharedfs import fault_seam

# Data-Juicer's own columns (``__dj__stats__``, ``__dj__meta__``, hash columns, ...) start with its
# DEFAULT_PREFIX: its exporter's business, written as it makes them.
from data_juicer_elastic.stats.columns import TAG_PREFIX as DATA_JUICER_PREFIX


def equivalent(out: Any, value: Any) -> bool:
    """Whether ``out`` is what Arrow (and Ray's per-batch re-typing) makes of the input ``value``."""
    cls = value.__class__
    if cls is str:  # by far the most values: the text an operator changed or not
        return out.__class__ is str and out == value
    if value is None:
        return out is None
    kind = out.__class__
    if cls is int:
        if kind is int:
            return out == value
        # Arrow rounds the integer to the nearest double (Python's int == float is exact, so round first)
        return kind is float and out == _as_float(value)
    if cls is float:
        return kind is float and out == value and copysign(1.0, out) == copysign(1.0, value)
    if cls is bool:  # pyarrow's inference turns a bool after a double into 1.0/0.0 ([1.5, True])
        return (kind is bool or kind is float) and out == value
    if cls is dict:
        if kind is not dict:
            return False
        for key, sub in value.items():
            if key not in out or not equivalent(out[key], sub):
                return False
        return len(out) == len(value) or all(v is None for k, v in out.items() if k not in value)
    if cls is list:
        return kind is list and len(out) == len(value) and all(map(equivalent, out, value))
    return False


def _as_float(value: int) -> float | None:
    try:
        return float(value)
    except OverflowError:  # no double holds it: such a column carries Python objects, never doubles
        return None


def restore(value: Any, out: Any, depth: int = 1) -> Any:
    """What to write for the input ``value`` (``depth`` levels below its row) that came out as ``out``."""
    if equivalent(out, value):
        return value
    if depth >= MAX_TYPED_DEPTH:
        return out  # a changed value this deep is written as the operator left it (bounded recursion)
    if value.__class__ is dict and out.__class__ is dict:
        return restore_fields(value, out, depth + 1)
    if value.__class__ is list and out.__class__ is list and len(value) == len(out):
        return [restore(v, o, depth + 1) for v, o in zip(value, out, strict=True)]
    return created(out, depth)


def restore_fields(value: dict[str, Any], out: dict[str, Any], depth: int = 1) -> dict[str, Any]:
    """An object (a row, or an object inside one) with the input's keys in the input's order, each
    restored (null when an operator deleted or nulled it), then the keys operators added, by name
    (Arrow orders a batch's keys by the first row having each), a null under them dropped.
    Data-Juicer's own columns (``__dj__``: stats, meta, hashes) are written as it makes them."""
    result: dict[str, Any] = {}
    for key, sub in value.items():
        if key in out:
            result[key] = restore(sub, out[key], depth)
        elif not key.startswith(DATA_JUICER_PREFIX):  # Data-Juicer's export layout takes its own out
            result[key] = None
    for key in sorted(k for k in out if k not in value):
        sub = out[key]
        if key.startswith(DATA_JUICER_PREFIX):
            result[key] = sub
        elif sub is not None:
            result[key] = created(sub, depth)
    return result


def created(out: Any, depth: int = 1) -> Any:
    """A value an operator made as the same bytes in any batch: as by :func:`restore_fields`, a
    null under an object's key is dropped and the keys go by name."""
    if depth >= MAX_TYPED_DEPTH:
        return out
    if out.__class__ is dict:
        return {k: created(out[k], depth + 1) for k in sorted(out) if out[k] is not None}
    if out.__class__ is list:
        return [created(v, depth + 1) for v in out]
    return out


# HashKeys the Data-Juicer exporters drop unless keep_hashes_in_res_ds (hash, minhash, simhash, imagehash, videohash)
HASH_FIELDS: Final = ("__dj__hash", "__dj__minhash", "__dj__simhash", "__dj__imagehash", "__dj__videohash")
DROP_MARK: Final = re.compile(r"__dj_elastic_drop_\d+__")
_OPTIONS: Final = orjson.OPT_SERIALIZE_NUMPY
_FALLBACK: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class WrittenFile:
    path: Path
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ShardWrite:
    output: WrittenFile
    row_stats: WrittenFile | None  # None when the result has neither stats nor meta columns


@dataclass(frozen=True)
class ExportLayout:
    keep_stats: bool = False  # keep_stats_in_res_ds
    keep_hashes: bool = False  # keep_hashes_in_res_ds

    @classmethod
    def from_cfg(cls, cfg: Any) -> ExportLayout:
        return cls(bool(cfg.get("keep_stats_in_res_ds", False)), bool(cfg.get("keep_hashes_in_res_ds", False)))


def encode_row(row: dict[str, Any]) -> bytes:
    """One output line (with its newline); the same row always gives the same bytes."""
    try:
        return orjson.dumps(row, option=_OPTIONS | orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        pass  # an integer beyond 64 bits, or a value orjson does not know
    try:
        return (_FALLBACK.encode(_finite(row)) + "\n").encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise ElasticError(
            f"an output row cannot be written as JSON: {exc}",
            hint="an operator returned a value that is not JSON data (bytes, sets, objects); convert it in the recipe",
        ) from None


def _finite(value: Any) -> Any:
    """Non-finite doubles as null, as orjson writes them (only on the rare fallback path)."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is dict:
        return {k: _finite(v) for k, v in value.items()}
    if type(value) is list:
        return [_finite(v) for v in value]
    return value


class _HashedFile:
    """A new file written under a temp name, counted and hashed as it goes, fsynced and renamed."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self.digest = hashlib.sha256()
        self.rows = self.bytes = 0
        self._handle = open(self.tmp, "wb")  # noqa: SIM115 - closed in finish/abort

    def write(self, line: bytes) -> None:
        self._handle.write(line)
        self.digest.update(line)
        self.rows += 1
        self.bytes += len(line)

    def finish(self) -> WrittenFile:
        self._handle.flush()
        fault_seam.fault_point("fsync", self.tmp)
        os.fsync(self._handle.fileno())
        self._handle.close()
        os.replace(self.tmp, self.path)
        return WrittenFile(self.path, self.rows, self.bytes, self.digest.hexdigest())

    def abort(self) -> None:
        self._handle.close()
        self.tmp.unlink(missing_ok=True)


def write_shard(
    batches: Iterable[Any],
    columns: list[str] | None,
    inputs: InputRows,
    output_path: Path,
    row_stats_path: Path,
    layout: ExportLayout,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> ShardWrite:
    """Write the rows of ``batches`` (Arrow tables in order; ``columns``: the result's columns,
    None when Ray lost them because nothing was left) to ``output_path`` and their stats
    rows to ``row_stats_path``.  ``on_row`` sees each row's stats (the stats summary)."""
    columns = columns or []
    stats_columns = [c for c in (STATS_FIELD, META_FIELD) if c in columns]
    drop = [] if layout.keep_stats else list(stats_columns)
    if not layout.keep_hashes:
        drop += [c for c in HASH_FIELDS if c in columns]
    # a dedup stage's drop marks (dedup.stages.drop_column): its drop operator removes them; never output
    drop += [c for c in columns if DROP_MARK.fullmatch(c)]
    out = _HashedFile(output_path)
    stats = _HashedFile(row_stats_path) if stats_columns else None
    try:
        fault_seam.fault_point("write", out.tmp)  # fault injection / named crash point (a no-op unless a test sets one)
        for batch in batches:
            for row in batch.to_pylist():
                number = row.pop(ROW_COLUMN, None)
                stats_row = {c: row[c] for c in stats_columns}
                for name in drop:
                    del row[name]
                if number is not None:
                    row = restore_fields(inputs.get(number), row)
                out.write(encode_row(row))
                if stats is not None:
                    stats.write(encode_row(stats_row))
                if on_row is not None:
                    on_row(stats_row)
        written = out.finish()
        return ShardWrite(written, stats.finish() if stats is not None else None)
    except BaseException:
        out.abort()
        if stats is not None:
            stats.abort()
        raise
