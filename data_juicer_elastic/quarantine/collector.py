"""Inside the operators: catch a failing batch, bisect it, keep the good rows, record the bad ones in this
process's record file in the attempt directory (docs/quarantine.md, "What happens").  Outside an
``elastic_sharded`` attempt (no attempt context in the operator's ``work_dir``) Data-Juicer's own wrapper
runs, unchanged.

The bisection (:func:`isolate`) finds the rows of a batch an operator fails on over isolated halves
(:func:`batching.engine.take_slice`), and keeps what the others give, in row order.  A batch whose
halves all succeed (an error that depends on the batch, not on a row) yields every row and no failing row.

After a shard's operators ran, the runner folds the Ray workers' records into the attempt's
``errors.jsonl`` (:mod:`jobdir.exports`), in input order with each input row's own bytes, and
applies ``elastic.max_error_rows`` (:func:`fold_errors`, :func:`check_limit`).
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from loguru import logger

from data_juicer_elastic.batching.engine import (
    SKIPPED_EXTRA,
    batch_rows,
    column,
    empty_like,
    is_arrow,
    merge,
    take_slice,
)
from data_juicer_elastic.batching.runtime import host_tag, read_context, stage_key_for
from data_juicer_elastic.compat.dj_ops_internals import HookCall, op_name
from data_juicer_elastic.errors import ShardExecutionError, clip
from data_juicer_elastic.jobdir.exports import ERRORS_FILE, WORKER_DIR, QuarantineRecord, encode_line
from data_juicer_elastic.rows.row_schema import ROW_COLUMN
from data_juicer_elastic.sharedfs import fsio

MAX_MESSAGE_CHARS: Final = 2000


@dataclass(frozen=True)
class RowFailure:
    position: int  # the row's position in the batch
    error_type: str  # the exception's class name
    message: str  # its message (truncated)


@dataclass
class Isolation:
    """What bisecting one failed range gave: the outputs of the halves that succeeded (with their
    row ranges, in row order), the failing rows, and how many calls it took."""

    parts: list[tuple[range, Any]] = field(default_factory=list)
    failures: list[RowFailure] = field(default_factory=list)
    calls: int = 0


def describe(exc: BaseException) -> tuple[str, str]:
    """(class name, message) of an operator's exception, the message cut to a readable size."""
    return type(exc).__name__, clip(str(exc), MAX_MESSAGE_CHARS)


def isolate(
    call: Callable[[dict[str, Any]], Any],
    batch: Any,
    start: int,
    stop: int,
    total: int,
    first_error: BaseException,
    *,
    fatal: Callable[[BaseException], bool] | None = None,
) -> Isolation:
    """Bisect rows ``[start, stop)`` of ``batch`` (``total`` rows; a dict of lists or an Arrow table),
    on which ``call`` raised ``first_error``.  ``fatal(exc)``: an exception that is not a row's fault
    (an out-of-memory error), raised at once, never quarantined."""
    found = Isolation()
    if stop - start == 1:
        found.failures.append(RowFailure(start, *describe(first_error)))
        return found
    pending = list(_halves(start, stop))  # a stack: the lower half on top, so rows come out in order
    while pending:
        low, high = pending.pop()
        piece = take_slice(batch, low, high, total)
        found.calls += 1
        try:
            output = call(piece)
        except Exception as exc:
            if fatal is not None and fatal(exc):
                raise
            if high - low == 1:
                found.failures.append(RowFailure(low, *describe(exc)))
            else:
                pending.extend(_halves(low, high))
            continue
        found.parts.append((range(low, high), output))
    return found


def _halves(low: int, high: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(upper half, lower half): pushed in that order, the lower half is taken first."""
    middle = (low + high) // 2
    return (middle, high), (low, middle)


_STAGE_PREFIX: Final = "stage-"


def wrap_hook(built: Callable[..., Any], call: HookCall) -> Callable[..., Any]:
    """What an operator gets from Data-Juicer's error hooks (``compat.dj_ops_internals.install_error_hooks``)."""
    if not call.skip_op_error:
        return built  # skip_op_error: false fails on the first error, as Data-Juicer does
    if call.batched:
        return QuarantinedBatch(built, call.method, call.keep_decision)
    return QuarantinedRow(built, call.method, call.return_sample)


class Sink:
    """One attempt's record file in this process."""

    def __init__(self, directory: Path, context: Any):
        self.path = directory / f"{host_tag()}-{os.getpid()}.jsonl"
        self.context = context
        self._lock = threading.Lock()
        self._op_index: dict[int, tuple[str, int | None]] = {}

    def record(self, op: Any, failures: list[RowFailure], batch: Any, total: int) -> None:
        if not failures:
            return
        stage, index = self._stage(op)
        numbers = column(batch, ROW_COLUMN)
        if numbers is not None and len(numbers) != total:
            numbers = None  # not one row number per row: name no input row rather than a wrong one
        lines = []
        for failure in failures:
            number = numbers[failure.position] if numbers is not None else None
            record: dict[str, Any] = {
                "n": number,
                "op": op_name(op),
                "stage": stage,
                "op_index": index,
                "type": failure.error_type,
                "message": failure.message,
            }
            if number is None:  # a row an operator made: keep it as the failing operator saw it
                piece = take_slice(batch, failure.position, failure.position + 1, total)
                record["seen"] = {k: v[0] for k, v in piece.items() if k != ROW_COLUMN}
            lines.append(orjson.dumps(record, default=repr, option=orjson.OPT_APPEND_NEWLINE))
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, b"".join(lines))
            finally:
                os.close(fd)

    def _stage(self, op: Any) -> tuple[str, int | None]:
        found = self._op_index.get(id(op))
        if found is None:
            stage = stage_key_for(op, self.context)
            index = int(stage[len(_STAGE_PREFIX) :].split("-", 1)[0]) if stage.startswith(_STAGE_PREFIX) else None
            found = self._op_index[id(op)] = (stage, index)
        return found


_sinks: dict[str, Sink | None] = {}  # by the operator's work_dir (None: no attempt context there)
_sinks_lock = threading.Lock()


def active_sink(op: Any) -> Sink | None:
    """The record file of the attempt ``op`` serves now, None outside an elastic_sharded attempt.
    One dict lookup per call once the operator's ``work_dir`` was seen (Ray calls a per-row operator
    once per row)."""
    work_dir = getattr(op, "work_dir", None)
    try:
        return _sinks[work_dir]
    except (KeyError, TypeError):
        pass
    context = read_context(work_dir) if isinstance(work_dir, str) else None
    sink = None
    if context is not None:
        directory = context.attempt_path / WORKER_DIR
        sink = Sink(directory, context)
    with _sinks_lock:
        sink = _sinks.setdefault(work_dir, sink) if isinstance(work_dir, str) else sink
        while len(_sinks) > 64:  # work dirs of attempts this process served long ago
            _sinks.pop(next(iter(_sinks)))
    return sink


class QuarantinedBatch:
    """A batched ``process`` / ``compute_stats``: Data-Juicer's wrapper, or the method with quarantine."""

    def __init__(self, built: Callable[..., Any], method: Callable[..., Any], keep_decision: bool):
        self.built, self.method, self.keep_decision = built, method, keep_decision
        self.__wrapped__ = method  # what functools.wraps would say: tracers and docs look here

    def __call__(self, samples: Any, *args: Any, **kwargs: Any) -> Any:
        op = getattr(self.method, "__self__", None)
        sink = active_sink(op)
        if sink is None:
            return self.built(samples, *args, **kwargs)
        # What the bisection slices: an Arrow batch no call can change; a dict's columns copied (references
        # only: Data-Juicer's own process_batched assigns samples[key][i] in place before it can fail).  A
        # keep decision's dict is Data-Juicer's throwaway copy of the block, which it only reads: not copied.
        source = samples
        if not is_arrow(samples) and not self.keep_decision:
            source = {k: list(v) if isinstance(v, list) else v for k, v in samples.items()}

        def call(batch: Any) -> Any:
            out = self.method(batch, *args, **kwargs)
            return list(out) if self.keep_decision else out

        try:
            return call(samples.to_pydict() if is_arrow(samples) else samples)
        except Exception as exc:
            total = batch_rows(source, where=op_name(op))
            found = isolate(call, source, 0, total, total, exc)
            sink.record(op, found.failures, source, total)
            return self._combine(found, source, total)

    def _combine(self, found: Isolation, source: Any, total: int) -> Any:
        if self.keep_decision:
            keep = [False] * total  # a row whose keep decision failed is not kept
            for rows, out in found.parts:
                if len(out) != len(rows):
                    raise ValueError(f"{len(out)} keep decisions for {len(rows)} rows")
                keep[rows.start : rows.stop] = out
            return keep
        outputs = [out for _, out in found.parts]
        return merge(outputs, where="quarantine") if outputs else empty_like(source, extra=SKIPPED_EXTRA)


class QuarantinedRow:
    """A single-row ``process`` / ``compute_stats`` (Ray hands it one-row batches; a Filter's row-level
    keep decision gets a plain row): Data-Juicer's wrapper, or the method with quarantine."""

    def __init__(self, built: Callable[..., Any], method: Callable[..., Any], return_sample: bool):
        self.built, self.method, self.return_sample = built, method, return_sample
        self.__wrapped__ = method

    def __call__(self, sample: Any, *args: Any, **kwargs: Any) -> Any:
        op = getattr(self.method, "__self__", None)
        sink = active_sink(op)
        if sink is None:
            return self.built(sample, *args, **kwargs)
        data = sample.to_pydict() if is_arrow(sample) else sample
        if not _one_row_batch(data):  # a plain row: only a keep decision can leave it out
            try:
                return self.method(data, *args, **kwargs)
            except Exception as exc:
                if self.return_sample:
                    raise
                sink.record(op, [RowFailure(0, *describe(exc))], {k: [v] for k, v in data.items()}, 1)
                return False
        try:  # the method gets a new dict: it cannot reach the sample's lists, which stay as they are
            result = self.method({key: values[0] for key, values in data.items()}, *args, **kwargs)
        except Exception as exc:
            sink.record(op, [RowFailure(0, *describe(exc))], sample, 1)
            return empty_like(data, extra=SKIPPED_EXTRA) if self.return_sample else [False]
        return {key: [value] for key, value in result.items()} if self.return_sample else [result]


def engine_quarantine(op: Any, call: Callable[[Any], Any], fatal: Callable[[BaseException], bool]) -> Any:
    """For adaptive batching's micro-batch loop (``batching.engine.MicroBatcher``): a function
    ``(batch, start, stop, total, error) -> Isolation`` that bisects a failed slice and records its
    failing rows, or None outside an elastic_sharded attempt (the loop then skips the slice)."""
    sink = active_sink(op)
    if sink is None:
        return None

    def quarantine(batch: Any, start: int, stop: int, total: int, error: BaseException) -> Isolation:
        found = isolate(call, batch, start, stop, total, error, fatal=fatal)
        sink.record(op, found.failures, batch, total)
        return found

    return quarantine


def _one_row_batch(sample: Any) -> bool:
    """Data-Juicer's test for a batched sample in catch_map_single_exception: every value a list, all one length."""
    values = iter(sample.values())
    first = next(values, None)
    return isinstance(first, list) and all(isinstance(value, list) and len(value) == len(first) for value in values)


SETTING: Final = "elastic.max_error_rows"


@dataclass(frozen=True)
class Quarantined:
    """An attempt's quarantined rows: the file (None when there are none), how many, the first."""

    path: Path | None
    rows: int
    first: QuarantineRecord | None


def fold_errors(
    attempt_dir: Path,
    shard_id: str,
    input_lines: Callable[[], Iterable[bytes]],
    first_row: Callable[[], int],
) -> Quarantined:
    """Write ``attempt_dir/errors.jsonl`` from the workers' records (nothing when there are none).

    ``input_lines()``: the shard's rows as stored (without newlines, in order), read to their end
    even past the last row wanted: a source that checks its content once read whole
    (``rows.shard_source.iter_source_lines``: against its scan's sha256) raises there, before the
    file is written, when the rows taken are not the content that was scanned.  ``first_row()``:
    the global number of the shard's first row.  Both are called only when some row failed."""
    records = _read_records(attempt_dir / WORKER_DIR)
    if not records:
        return Quarantined(None, 0, None)
    offset = first_row()
    wanted = sorted({r["n"] for r in records if r["n"] is not None})
    rows = _input_rows(input_lines(), wanted, shard_id) if wanted else {}  # no input row copied: none read
    path = attempt_dir / ERRORS_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    first: QuarantineRecord | None = None
    with open(tmp, "wb") as handle:
        for record in records:
            number = record["n"]
            error = QuarantineRecord(
                row_number=None if number is None else offset + number,
                shard=shard_id,
                shard_row=number,
                op=str(record.get("op")),
                op_index=record.get("op_index"),
                error_type=str(record.get("type")),
                error=str(record.get("message")),
            )
            first = first or error
            row = rows[number] if number is not None else orjson.dumps(record.get("seen"), default=repr)
            handle.write(encode_line(error, row))
    os.replace(tmp, path)
    return Quarantined(path, len(records), first)


def allowed_errors(max_error_rows: float, input_rows: int) -> int:
    """Rows a shard of ``input_rows`` may quarantine: a count (>= 1), or a fraction (< 1) of its rows,
    rounded up, so that a fraction lets every non-empty shard set at least one row aside."""
    return int(max_error_rows) if max_error_rows >= 1 else math.ceil(max_error_rows * input_rows)


def check_limit(found: Quarantined, max_error_rows: float, input_rows: int, where: str) -> None:
    """ShardExecutionError (the shard fails like any error) when more rows failed than allowed."""
    allowed = allowed_errors(max_error_rows, input_rows)
    if found.rows <= allowed:
        return
    raise ShardExecutionError(
        f"operators failed on {found.rows} of {input_rows} rows, more than {SETTING}={max_error_rows:g} allows "
        f"({allowed}); the first: {found.first.describe() if found.first else 'unknown'}",
        where=where,
        hint=f"fix the operator or those rows (each with its error: {found.path}), or raise {SETTING}",
    )


def _read_records(directory: Path) -> list[dict[str, Any]]:
    """The workers' records, deduplicated, in input order (rows an operator made last).  A row recorded twice
    (Ray re-ran a task after its worker died) is one: same number, operator stage and row the operator saw."""
    seen: dict[tuple, dict[str, Any]] = {}
    for name in sorted(fsio.list_names(directory)):
        if not name.endswith(".jsonl"):
            continue
        with open(directory / name, "rb") as handle:
            for line in handle:
                if not line.endswith(b"\n"):
                    logger.warning(f"ignoring a torn quarantine record in {directory / name}")
                    continue
                record = orjson.loads(line)
                seen_row = orjson.dumps(record.get("seen"), option=orjson.OPT_SORT_KEYS, default=repr)
                key = (record.get("n"), str(record.get("stage")), hashlib.sha256(seen_row).hexdigest())
                seen.setdefault(key, record)
    # rows without a number (an operator made them) after every numbered row
    return [seen[key] for key in sorted(seen, key=lambda k: (k[0] is None, k[0] or 0, k[1:]))]


def _input_rows(lines: Iterable[bytes], wanted: list[int], shard_id: str) -> dict[int, bytes]:
    targets = set(wanted)
    # every line, not only up to the last row wanted: the source compares its content with the scan
    # only at its end, and a row copied into the errors file is published as the input's
    found = {number: bytes(line) for number, line in enumerate(lines) if number in targets}
    if len(found) != len(wanted):
        raise ShardExecutionError(
            f"a quarantine record names input row {wanted[len(found)]}, which the shard does not have",
            where=f"shard {shard_id}",
            hint="an operator changed the internal row number column; report it",
        )
    return found
