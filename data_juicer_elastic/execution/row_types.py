"""How the job's row schema is held in Arrow: one Arrow schema for every shard of a job, each JSON type
as Data-Juicer's default executor types the column (a ``json`` column carries Python objects).  The
rules: docs/lossless.md; what Arrow loses is put back by :mod:`execution.lossless`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from data_juicer_elastic.errors import JobDirError
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
