"""Progress displays for long local steps: a tqdm bar on a terminal, periodic log lines elsewhere.

* :class:`StepDisplay` receives ``jobdir.steps`` reports (prepare passes, merge).
* :func:`shard_display` follows a worker's current shard through its live
  progress tracker (``jobdir.progress``): rows read of the shard and the stage.

On a terminal (stderr is a TTY) the bars redraw in place; otherwise (a
scheduler's log file) one log line every ``LOG_EVERY_SECS`` and one at the end,
so logs stay readable.  tqdm is a dependency of Data-Juicer already.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.jobdir.progress import ProgressRecord, ProgressTracker, Stage

LOG_EVERY_SECS: Final = 30.0


def on_terminal(stream: Any = None) -> bool:
    stream = sys.stderr if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"


class _Bar:
    """One step's display: tqdm on a terminal, log lines every ``log_every`` seconds otherwise."""

    def __init__(self, name: str, total: int | None, unit: str, terminal: bool, log_every: float, clock):
        self.name, self.total, self.unit, self.clock, self.log_every = name, total, unit, clock, log_every
        self.done = 0
        self.started = self.last_log = clock()
        self.tqdm = None
        if terminal:
            from tqdm import tqdm

            scale = unit == "B"
            self.tqdm = tqdm(total=total, desc=name, unit=unit, unit_scale=scale, file=sys.stderr, leave=True)

    def set(self, done: int, total: int | None, note: str = "") -> None:
        if self.tqdm is not None:
            if total != self.tqdm.total:
                self.tqdm.total = total
            if note:
                self.tqdm.set_postfix_str(note, refresh=False)
            self.tqdm.update(done - self.done)
        self.done, self.total = done, total
        if self.tqdm is None and self.clock() - self.last_log >= self.log_every:
            self.last_log = self.clock()
            self._log(note)

    def close(self, note: str = "") -> None:
        if self.tqdm is not None:
            self.tqdm.close()
        else:
            self._log(note, final=True)

    def _log(self, note: str, final: bool = False) -> None:
        secs = max(self.clock() - self.started, 1e-9)
        amount = _amount(self.done, self.unit) + (f"/{_amount(self.total, self.unit)}" if self.total else "")
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        rate = f", {_amount(self.done / secs, self.unit)}/s" if self.done else ""
        what = "finished" if final else "progress"
        logger.info(f"{self.name}: {what} {amount}{pct} in {secs:.0f}s{rate}" + (f"; {note}" if note else ""))


def _amount(value: float | None, unit: str) -> str:
    if value is None:
        return "?"
    if unit != "B":
        return f"{value:.0f} {unit}"
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or suffix == "TiB":
            return f"{value:.1f} {suffix}" if suffix != "B" else f"{value:.0f} B"
        value /= 1024
    return f"{value} B"  # pragma: no cover


class StepDisplay:
    """A ``jobdir.steps`` callback: one bar per step name, the previous closed when a new one starts."""

    def __init__(self, unit: str = "B", *, terminal: bool | None = None, log_every: float = LOG_EVERY_SECS,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.unit, self.log_every, self.clock = unit, log_every, clock
        self.terminal = on_terminal() if terminal is None else terminal
        self.bar: _Bar | None = None

    def __call__(self, step: str, done: int, total: int | None) -> None:
        if self.bar is None or self.bar.name != step:
            self.close()
            self.bar = _Bar(step, total, self.unit, self.terminal, self.log_every, self.clock)
        self.bar.set(done, total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> StepDisplay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def shard_display(*, terminal: bool | None = None, log_every: float = LOG_EVERY_SECS,
                  clock: Callable[[], float] = time.monotonic) -> Callable[[ProgressTracker], None]:  # fmt: skip
    """An ``on_attempt`` hook for ``run_worker``: a display of each shard's rows read and stage."""
    terminal = on_terminal() if terminal is None else terminal

    def attach(tracker: ProgressTracker) -> None:
        record = tracker.current
        bar = _Bar(f"shard {record.shard_id}", record.rows_total, "rows", terminal, log_every, clock)

        def follow(update: ProgressRecord) -> None:
            note = update.stage + (f" [{update.operator[:40]}]" if update.operator else "")
            if update.stage == Stage.FINISHED:
                bar.set(update.rows_read, update.rows_total)
                bar.close(f"{update.rows_written} rows written")
                tracker.listeners.remove(follow)
            else:
                bar.set(update.rows_read, update.rows_total, note)

        tracker.listeners.append(follow)

    return attach
