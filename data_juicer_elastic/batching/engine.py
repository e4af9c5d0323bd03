"""The lossless micro-batch loop: slice, call, retry the same offset smaller on OOM, merge in order.

An unrecoverable OOM raises :class:`MicroBatchOOMError` whatever ``skip_errors`` says; each output
must keep the slice's rows, order columns and the first slice's columns (:class:`BatchContractError`).
The rules, and why ``sort_by_cost``: docs/adaptive-batching.md.

Column batches as Data-Juicer hands them to a batched Mapper: a mapping of column -> per-row sequence
(a dict, ``LazyBatch``) or a ``pyarrow.Table``.  Slices go to the operator as a fresh dict of lists, as
Data-Juicer gives ``process_batched``: a failed call may have mutated its slice, and the retry must not
see that.
"""

from __future__ import annotations

import copy
import gc
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from itertools import accumulate
from typing import Any, Final, Literal

from loguru import logger

from data_juicer_elastic.batching.policy import INF, Action, BatchPolicy, classify_oom
from data_juicer_elastic.errors import BatchContractError, MicroBatchOOMError, clip

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


Aggregate = Literal["sum", "padded"]
# Data-Juicer 1.6.1's logical-partition routing column (ray_partitioned): rows must keep it.
PARTITION_COLUMN: Final = "__data_juicer_logical_partition_id__"
# Data-Juicer's skip path (Fields.stats, Fields.source_file) returns these empty columns as well.
SKIPPED_EXTRA: Final = ("__dj__stats__", "__dj__source_file__")


def release_memory() -> None:
    """Return freed memory to the device: collect, then empty torch's CUDA cache if torch is in use."""
    gc.collect()
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        cuda.empty_cache()


@dataclass
class BatchStats:
    """What one process's micro-batching did (telemetry; counters only, bounded)."""

    outer_batches: int = 0
    rows_in: int = 0
    rows_out: int = 0
    slices: int = 0
    ooms: int = 0
    retries: int = 0  # re-runs of a slice after an OOM (including waits at the floor)
    floor_waits: int = 0
    skipped_slices: int = 0
    skipped_rows: int = 0
    terminal_ooms: int = 0
    oom_kinds: Counter = field(default_factory=Counter)
    sorted_batches: int = 0  # outer batches cut in cost order (sort_by_cost)
    first_rows: int | None = None  # size of the first slice attempted (a seeded start shows here)
    final_rows: int | None = None  # size of the last slice the budget sized (not an outer batch tail)
    min_rows: int | None = None
    max_rows: int | None = None
    last_oom: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "oom_kinds": dict(self.oom_kinds)}


def prefix_cost_fn(costs: Sequence[float] | None, offset: int, aggregate: Aggregate) -> Callable[[int], float]:
    """``cost(n)`` of rows ``[offset, offset + n)``: rows, sum of row costs, or n x max row cost (padding)."""
    if costs is None:
        return float
    if aggregate == "sum":
        cumulative = [0.0, *accumulate(float(c) for c in costs[offset:])]
        return cumulative.__getitem__
    running = [0.0, *accumulate((float(c) for c in costs[offset:]), max)]
    return lambda n: n * running[n]


@dataclass(eq=False)
class MicroBatcher:
    """Run ``fn`` over an outer batch in policy-sized micro-batches, each an isolated copy
    (:func:`take_slice`); with ``skip_errors`` a non-OOM failure drops only that slice (or
    ``quarantine`` bisects it)."""

    fn: Callable[[dict[str, Any]], Any]
    policy: BatchPolicy
    _: KW_ONLY
    label: str = "op"
    row_costs: Callable[[Any], Sequence[float] | None] | None = None
    aggregate: Aggregate = "sum"
    skip_errors: bool = False
    order_columns: Sequence[str] = (PARTITION_COLUMN,)
    cleanup: Callable[[], None] = release_memory
    sleep: Callable[[float], None] = time.sleep
    stats: BatchStats = field(default_factory=BatchStats)
    sort_by_cost: bool = False
    # (batch, start, stop, total, error) -> quarantine.collector.Isolation
    quarantine: Callable[[Any, int, int, int, BaseException], Any] | None = None

    def __call__(self, batch: Any) -> Any:
        total = batch_rows(batch, where=self.label)
        stats = self.stats
        stats.outer_batches += 1
        stats.rows_in += total
        if total == 0:
            return self.fn(take_slice(batch, 0, 0, 0))
        costs = self.row_costs(batch) if self.row_costs is not None else None
        permutation = self._cost_order(costs, total)
        if permutation is not None:
            batch = take_rows(batch, permutation, total)
            costs = [costs[i] for i in permutation]
            stats.sorted_batches += 1
        delivered: list[range] = []  # positions (in the order run) of the slices that came back
        skipped_before = stats.skipped_rows
        outputs: list[Any] = []
        expected_columns: list[str] | None = None
        offset = 0
        while offset < total:
            self.policy.begin_slice()
            prefix_cost = prefix_cost_fn(costs, offset, self.aggregate)
            slice_ooms = 0
            while True:
                remaining = total - offset
                rows = self.policy.choose_rows(remaining, prefix_cost)
                cost = prefix_cost(rows)
                if stats.first_rows is None:
                    stats.first_rows = rows
                piece = take_slice(batch, offset, offset + rows, total)
                order = {c: list(piece[c]) for c in self.order_columns if c in piece}
                where = f"{self.label}: rows {offset}..{offset + rows - 1} of a {total}-row batch"
                try:
                    output = self.fn(piece)
                except Exception as exc:
                    kind = classify_oom(exc)
                    if kind is None:
                        if not self.skip_errors:
                            raise
                        stats.skipped_slices += 1
                        if self.quarantine is not None:  # keep the slice's good rows, set the failing ones aside
                            found = self.quarantine(batch, offset, offset + rows, total, exc)
                            outputs += [part for _, part in found.parts]
                            delivered += [positions for positions, _ in found.parts]
                            stats.skipped_rows += len(found.failures)
                        else:
                            logger.opt(exception=exc).error(f"{where}: skipping this micro-batch (skip_op_error)")
                            stats.skipped_rows += rows
                        offset += rows
                        break
                    slice_ooms += 1
                    stats.ooms += 1
                    stats.oom_kinds[kind.value] += 1
                    stats.last_oom = f"{type(exc).__name__}: {_first_line(exc)}"
                    decision = self.policy.on_oom(rows, cost)
                    if decision.action is Action.FAIL or slice_ooms > self.policy.slice_oom_budget:
                        stats.terminal_ooms += 1
                        raise MicroBatchOOMError(
                            f"out of memory with {rows} row(s) after {slice_ooms} OOMs and "
                            f"{self.policy.config.floor_retries} waits for this slice; last error: {stats.last_oom}",
                            where=where,
                            hint="one row does not fit: free accelerator memory (fewer actors per GPU, a smaller "
                            "model), or remove the row; skip_op_error never drops rows on OOM",
                        ) from exc
                    logger.info(
                        f"{where}: out of memory ({kind.value}, cost {cost:g}); retrying the same rows"
                        + (" at the same size after cleanup" if decision.same_size else " smaller")
                    )
                    # Tensors stay alive while the traceback references the frames that made them.
                    traceback.clear_frames(exc.__traceback__)
                else:
                    self._check(output, rows, order, expected_columns, where)
                    if expected_columns is None:
                        expected_columns = columns(output)
                    budget_bound = rows < remaining and prefix_cost(rows + 1) > self.policy.budget
                    self.policy.on_success(rows, cost, budget_bound=budget_bound)
                    outputs.append(output)
                    delivered.append(range(offset, offset + rows))
                    stats.slices += 1
                    if budget_bound or rows == self.policy.max_rows or (offset == 0 and rows == total):
                        stats.final_rows = rows  # a slice the budget sized, not an outer batch's tail
                    stats.min_rows = rows if stats.min_rows is None else min(stats.min_rows, rows)
                    stats.max_rows = rows if stats.max_rows is None else max(stats.max_rows, rows)
                    offset += rows
                    break
                # Only OOMs get here, after the except block dropped the exception.
                del piece, order
                stats.retries += 1
                self.cleanup()
                if decision.action is Action.WAIT:
                    stats.floor_waits += 1
                    logger.warning(f"{where}: out of memory at the minimum size; retrying in {decision.wait_secs:g}s")
                    self.sleep(decision.wait_secs)
        if not outputs:
            return empty_like(batch, extra=SKIPPED_EXTRA)
        merged = merge(outputs, where=self.label)
        stats.rows_out += total - stats.skipped_rows + skipped_before
        if permutation is None:
            return merged
        source = [permutation[position] for part in delivered for position in part]  # input row of each output row
        restore = sorted(range(len(source)), key=source.__getitem__)
        return take_rows(merged, restore, len(source))

    def _cost_order(self, costs: Sequence[float] | None, total: int) -> list[int] | None:
        """Rows by descending cost (ties in input order), or None: input order (no sorting asked for, no
        costs, already sorted, or a learned budget says the whole batch fits one slice, where the order
        cannot matter; with nothing learned yet the first slice may well fail, so it is sorted)."""
        if not self.sort_by_cost or costs is None or total < 2:
            return None
        self.policy.begin_slice()
        fits = self.policy.choose_rows(total, prefix_cost_fn(costs, 0, self.aggregate)) >= total
        if fits and self.policy.budget != INF:
            return None
        order = sorted(range(total), key=lambda i: -float(costs[i]))
        return None if order == list(range(total)) else order

    def _check(self, output: Any, rows: int, order: dict[str, list], expected: list[str] | None, where: str) -> None:
        got = batch_rows(output, where=where)
        if got != rows:
            raise BatchContractError(
                f"the operator returned {got} rows for a {rows}-row micro-batch",
                where=where,
                hint="adaptive batching needs a Mapper that keeps row count and order; turn adaptive_batching off "
                "for this operator",
            )
        for name, before in order.items():
            after = column(output, name)
            if after is None or list(after) != before:
                raise BatchContractError(
                    f"the operator changed or reordered column {name!r}",
                    where=where,
                    hint="rows must come back in input order with their routing/index columns unchanged",
                )
        if expected is not None:
            names = columns(output)
            if set(names) != set(expected):
                added = sorted(set(names) - set(expected))
                missing = sorted(set(expected) - set(names))
                raise BatchContractError(
                    f"micro-batches returned different columns (new {added}, missing {missing})",
                    where=where,
                    hint="the operator's output columns must not depend on how the batch is sliced",
                )


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    return clip(line, limit)
