"""Find the rows of a batch an operator fails on, by bisection over isolated halves
(:func:`batching.batches.take_slice`), and keep what the others give, in row order (docs/quarantine.md,
"What happens").  A batch whose halves all succeed (an error that depends on the batch, not on a row)
yields every row and no failing row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from data_juicer_elastic.batching.batches import take_slice
from data_juicer_elastic.errors import clip

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
