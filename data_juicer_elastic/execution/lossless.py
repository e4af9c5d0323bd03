"""Put back what Arrow changed and no operator did: each untouched value exactly as it was read.

The writer compares each output row with its input row (``ROW_COLUMN``): a value :func:`equivalent`
to the input's is written as the input had it, anything else as the operator made it.  The rules
(equivalence, null vs absent, key order): docs/lossless.md.
"""

from __future__ import annotations

from math import copysign
from typing import Any

from data_juicer_elastic.rows.row_schema import MAX_TYPED_DEPTH

# Data-Juicer's own columns (``__dj__stats__``, ``__dj__meta__``, hash columns, ...) start with its
# DEFAULT_PREFIX: its exporter's business, written as it makes them (``row_writer``).
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
