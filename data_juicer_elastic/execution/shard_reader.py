"""Read one shard into Arrow with the job's row schema (:class:`ArrowRows`), find its input
rows again for the writer, and give Data-Juicer's Ray loader the shard as read, for the length of
one shard run.  Why not Ray's JSON reader: docs/lossless.md.

The job's row schema in Arrow: one Arrow schema for every shard of a job, each JSON type as
Data-Juicer's default executor types the column (a ``json`` column carries Python objects).  The
rules: docs/lossless.md; what Arrow loses is put back by :mod:`execution.row_writer`.

While :func:`shard_source` is active, ``RayDataset.read`` answers the attempt's shard path with a
materialized Ray dataset built from :func:`read_tables` (why materialized: docs/architecture.md,
"execution").  The swap (``compat.dj_ops_internals``) is reference-counted across threads and serves
only registered paths: any other path read meanwhile is refused.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jiter

from data_juicer_elastic.compat import dj_ops_internals
from data_juicer_elastic.compat.dj_ops_internals import RAY_DATASET_READ
from data_juicer_elastic.errors import IntegrationError, IntegrityError, JobDirError
from data_juicer_elastic.rows.row_schema import (
    BOOL,
    FLOAT,
    INT,
    NULL,
    ROW_COLUMN,
    STRING,
    ListType,
    RowSchema,
    StructType,
    has_json,
)
from data_juicer_elastic.rows.shard_source import ShardSource, iter_content, iter_source_lines


def arrow_type(t: Any) -> Any:
    import pyarrow as pa

    if isinstance(t, StructType):
        return pa.struct([pa.field(k, arrow_type(v)) for k, v in t.fields.items()])
    if isinstance(t, ListType):
        return pa.list_(arrow_type(t.item))
    return {NULL: pa.null(), BOOL: pa.bool_(), INT: pa.int64(), FLOAT: pa.float64(), STRING: pa.string()}[t]


@dataclass(frozen=True)
class ArrowRows:
    """The Arrow side of one job's row schema."""

    schema: RowSchema
    native: Any  # pa.Schema of the columns Arrow types natively, in schema order
    opaque: frozenset[str]  # columns holding Python objects
    order: tuple[str, ...]  # every column, in schema order

    @classmethod
    def from_manifest(cls, row_schema: Any, where: str) -> ArrowRows:
        import pyarrow as pa

        if row_schema is None:
            raise JobDirError(
                "the manifest has no row schema: the job was prepared by an older data-juicer-elastic",
                where=where,
                hint="prepare the job again in a new job_dir",
            )
        try:
            schema = RowSchema.from_json(row_schema)
        except ValueError as exc:
            raise JobDirError(f"corrupt row schema in the manifest: {exc}", where=where) from None
        if ROW_COLUMN in schema.fields:
            raise JobDirError(f"the input has a key {ROW_COLUMN!r}, which data-juicer-elastic reserves", where=where)
        opaque = frozenset(k for k, t in schema.fields.items() if has_json(t))
        native = pa.schema([pa.field(k, arrow_type(t)) for k, t in schema.fields.items() if k not in opaque])
        return cls(schema, native, opaque, tuple(schema.fields))

    def table(self, rows: Sequence[dict[str, Any]], first_row: int) -> Any:
        """An Arrow table of ``rows`` (parsed input rows) in schema order, plus :data:`ROW_COLUMN`."""
        import pyarrow as pa

        try:
            native = pa.Table.from_pylist(rows, schema=self.native)
        except (pa.ArrowInvalid, OverflowError):
            # pyarrow refuses an integer a double holds only approximately (> 2**53); Data-Juicer's
            # default executor reads such a column as doubles, so convert as it would.
            fields = self.schema.fields
            coerced = [{k: _coerce(v, fields[k]) for k, v in row.items() if k in fields} for row in rows]
            native = pa.Table.from_pylist(coerced, schema=self.native)
        if not self.opaque:
            columns = list(native.columns)
        else:
            from ray.data.extensions import ArrowPythonObjectArray

            by_name = dict(zip(native.column_names, native.columns, strict=True))
            columns = [
                ArrowPythonObjectArray.from_objects([row.get(k) for row in rows]) if k in self.opaque else by_name[k]
                for k in self.order
            ]
        columns.append(pa.array(range(first_row, first_row + len(rows)), type=pa.int64()))
        return pa.Table.from_arrays(columns, names=[*self.order, ROW_COLUMN])


def _coerce(value: Any, t: Any) -> Any:
    """``value`` as Arrow holds it under type ``t``: integers in double positions become doubles."""
    if value is None:
        return None
    if t == FLOAT:
        return float(value) if type(value) is int else value
    if isinstance(t, StructType) and type(value) is dict:
        return {k: _coerce(v, t.fields[k]) for k, v in value.items() if k in t.fields}
    if isinstance(t, ListType) and type(value) is list:
        return [_coerce(v, t.item) for v in value]
    return value


BLOCK_BYTES: Final = 1024 * 1024


def parse(line: bytes, where: str) -> dict[str, Any]:
    try:
        row = jiter.from_json(line)
    except ValueError as exc:  # its scan validated every row: the shard was changed under us
        raise IntegrityError(f"shard row is not valid JSON: {exc}", where=where, hint="prepare a new job") from None
    if type(row) is not dict:
        raise IntegrityError("shard row is not a JSON object", where=where, hint="prepare a new job")
    return row


def read_tables(source: ShardSource, rows: ArrowRows, block_bytes: int = BLOCK_BYTES) -> list[Any]:
    """The shard as Arrow tables of about ``block_bytes`` of input each, rows in order.  Its
    content is checked against its scan while it is read (``rows.shard_source``): a changed input
    is an InputChangedError, raised before the last table is built."""
    tables: list[Any] = []
    pending: list[dict[str, Any]] = []
    size = first = 0
    try:
        for number, line in enumerate(iter_source_lines(source)):
            pending.append(parse(line, f"{source.where} row {number + 1}"))
            size += len(line) + 1
            if size >= block_bytes:
                tables.append(rows.table(pending, first))
                first += len(pending)
                pending, size = [], 0
        if pending:
            tables.append(rows.table(pending, first))
    except IntegrityError:
        # a row that does not parse: the input changed under us (the scan proved every row), and
        # reading it whole says so in the right words; else the original error stands
        for _ in iter_content(source):
            pass
        raise
    return tables


class InputRows:
    """The shard's input rows by row number, for the writer: a forward cursor over the file.

    Output rows come in input order, so one pass parses only the rows asked for; asking for an
    earlier row than the last starts the pass again (never so with Data-Juicer's operators)."""

    def __init__(self, source: ShardSource):
        self.source = source
        self._lines: Generator[bytes, None, None] | None = None
        self._next = 0  # number of the row the cursor reads next
        self._last: tuple[int, dict[str, Any]] | None = None

    def get(self, number: int) -> dict[str, Any]:
        """The input row ``number`` (0-based), parsed; a fresh object the caller may keep."""
        if self._last is not None and self._last[0] == number:
            return self._last[1]
        if self._lines is None or number < self._next:
            self.finish()  # a pass given up is read to its end first: the rows it handed out are checked too
            self._lines, self._next = iter_source_lines(self.source), 0
        line = b""
        while self._next <= number:
            line = next(self._lines, None)
            if line is None:
                raise IntegrityError(
                    f"an output row names input row {number}, but the shard has {self._next} rows",
                    where=self.source.where,
                    hint="an operator changed the internal row number column; report it",
                )
            self._next += 1
        row = parse(line, f"{self.source.where} row {number + 1}")
        self._last = (number, row)
        return row

    def close(self) -> None:
        if self._lines is not None:
            self._lines.close()
            self._lines = None

    def finish(self) -> None:
        """Read the rest of the shard, so its content check runs: the rows handed out came from
        the content that was scanned (InputChangedError otherwise).  Then close."""
        if self._lines is not None:
            for _ in self._lines:
                pass
        self.close()


_LOCK = threading.Lock()
_sources: dict[str, Callable[[], Any]] = {}  # shard path -> builds its dataset; guarded by _LOCK
_original: Any = None  # RayDataset.read as found by the first shard run


@contextlib.contextmanager
def shard_source(path: str | os.PathLike, build: Callable[[], Any]) -> Iterator[None]:
    """While active, ``RayDataset.read(<format>, path)`` returns ``build()`` (a materialized Ray Dataset)."""
    global _original
    key = os.path.abspath(path)
    dj_ops_internals.ray_dataset_class()  # fails loudly before anything is registered
    with _LOCK:
        if not _sources:
            _original = dj_ops_internals.replace_read(_read_shard)
        if key in _sources:
            raise IntegrationError(f"shard {key} is already being read by another run in this process")
        _sources[key] = build
    try:
        yield
    finally:
        with _LOCK:
            del _sources[key]
            if not _sources:
                dj_ops_internals.restore_read(_original)
                _original = None


def shard_key(attempt_dir: str | os.PathLike) -> Path:
    """The ``dataset_path`` Data-Juicer is given for a shard: only a key for :func:`shard_source`, an
    empty file (Data-Juicer's config treats a path that does not exist as a remote dataset)."""
    key = Path(attempt_dir) / "input.jsonl"
    if not key.exists():
        key.touch()
    return key


def _read_shard(klass: Any, data_format: Any, paths: Any, **kwargs: Any) -> Any:
    key = os.path.abspath(paths) if isinstance(paths, str | os.PathLike) else None
    with _LOCK:
        build = _sources.get(key) if key is not None else None
    if build is None:
        raise IntegrationError(
            f"Data-Juicer asked to read {paths!r} ({data_format}) while a shard runs; only the shard is read",
            where=RAY_DATASET_READ,
            hint="the shard recipe must not name other datasets",
        )
    return build()
