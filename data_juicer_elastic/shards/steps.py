"""A hook for long local steps (prepare passes, merge) to report how far they are.

How reports are shown is up to whoever installs the callback (``data_juicer_elastic.console``).  With none
installed a report costs one global lookup, but report every few thousand rows, not per row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

# (step name, units done, units in total or None when unknown)
StepCallback = Callable[[str, int, int | None], None]

_callback: StepCallback | None = None


def report(step: str, done: int, total: int | None) -> None:
    if _callback is not None:
        _callback(step, done, total)


@contextlib.contextmanager
def reporting(callback: StepCallback | None) -> Iterator[None]:
    """Send this process's step reports to ``callback`` inside the block."""
    global _callback
    previous, _callback = _callback, callback
    try:
        yield
    finally:
        _callback = previous
