"""Column batches as Data-Juicer hands them to a batched Mapper: length, isolated slices, ordered merge.

A batch is a mapping of column -> per-row sequence (a dict, ``LazyBatch``) or a ``pyarrow.Table``.
Slices go to the operator as a fresh dict of lists, as Data-Juicer gives ``process_batched``: a
failed call may have mutated its slice, and the retry must not see that.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final

from data_juicer_elastic.errors import BatchContractError

# Values whose copy is themselves: a slice of them needs no deep copy.
_ATOMIC: Final = (str, bytes, int, float, bool, type(None), complex)


def is_arrow(batch: Any) -> bool:
    return hasattr(batch, "num_rows") and hasattr(batch, "schema") and callable(getattr(batch, "slice", None))


def _is_column(value: Any) -> bool:
    return not isinstance(value, (str, bytes, Mapping)) and hasattr(value, "__len__") and hasattr(value, "__getitem__")


def batch_rows(batch: Any, *, where: str = "batch") -> int:
    """Rows of a column batch; BatchContractError when its columns disagree or it is not one."""
    if is_arrow(batch):
        return int(batch.num_rows)
    if not isinstance(batch, Mapping):
        raise BatchContractError(
            f"expected a column batch (dict of lists or pyarrow.Table), got {type(batch).__name__}", where=where
        )
    lengths = {key: len(value) for key, value in batch.items() if _is_column(value)}
    if not lengths:
        raise BatchContractError("the batch has no per-row columns", where=where)
    if len(set(lengths.values())) != 1:
        detail = ", ".join(f"{k}={n}" for k, n in sorted(lengths.items(), key=lambda kv: str(kv[0]))[:6])
        raise BatchContractError(f"columns have different row counts ({detail})", where=where)
    return next(iter(lengths.values()))


def columns(batch: Any) -> list[str]:
    return list(batch.column_names) if is_arrow(batch) else [str(k) for k in batch.keys()]


def column(batch: Any, name: str) -> Sequence[Any] | None:
    """One column as a Python sequence, or None when the batch has no such per-row column."""
    if is_arrow(batch):
        return batch.column(name).to_pylist() if name in batch.column_names else None
    value = batch.get(name) if isinstance(batch, Mapping) else None
    return value if value is not None and _is_column(value) else None


def take_slice(batch: Any, start: int, stop: int, total: int) -> dict[str, Any]:
    """Rows ``[start, stop)`` as a new dict of lists that shares no mutable object with ``batch``."""
    if is_arrow(batch):
        return batch.slice(start, stop - start).to_pydict()  # fresh Python objects
    piece: dict[str, Any] = {}
    for key, value in batch.items():
        if _is_column(value) and len(value) == total:
            rows = list(value[start:stop])
            piece[key] = rows if all(isinstance(v, _ATOMIC) for v in rows) else copy.deepcopy(rows)
        else:  # a batch-level value (rare): never shared either
            piece[key] = copy.deepcopy(value)
    return piece


def take_rows(batch: Any, indices: Sequence[int], total: int) -> Any:
    """Rows ``indices`` (in that order) of a dict or Arrow batch; batch-level values are kept as they are.
    Nested values are shared with ``batch``: :func:`take_slice` isolates what an operator gets."""
    if is_arrow(batch):
        return batch.take(list(indices))
    return {
        key: [value[i] for i in indices] if _is_column(value) and len(value) == total else value
        for key, value in batch.items()
    }


def merge(outputs: list[Any], *, where: str) -> Any:
    """Concatenate per-slice outputs in order (dicts of lists, or pyarrow Tables)."""
    if len(outputs) == 1:
        return outputs[0]
    if all(is_arrow(o) for o in outputs):
        import pyarrow

        try:
            return pyarrow.concat_tables(outputs)
        except (pyarrow.ArrowInvalid, pyarrow.ArrowTypeError) as exc:
            raise BatchContractError(f"micro-batch outputs have incompatible schemas: {exc}", where=where) from None
    if not all(isinstance(o, Mapping) for o in outputs):
        kinds = sorted({type(o).__name__ for o in outputs})
        raise BatchContractError(f"micro-batch outputs mix types {kinds}", where=where)
    return {key: [value for output in outputs for value in output[key]] for key in outputs[0]}


def empty_like(batch: Any, extra: Sequence[str] = ()) -> dict[str, list]:
    """A zero-row dict batch with ``batch``'s columns (what Data-Juicer returns for a skipped batch)."""
    return {name: [] for name in [*columns(batch), *extra]}
