"""The progress of prepare and merge steps: one live line per step on a terminal, else a log line
every ``LOG_EVERY_SECS`` and one when a long step ends.  The live line's elapsed time runs from
``started`` (the process's start, as the job's live line), the log lines give each step's own."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from data_juicer_elastic.console import quiet, terminal
from data_juicer_elastic.console.displays import LOG_EVERY_SECS, amount, live, meter_line
from data_juicer_elastic.console.meter import Clock, Meter


class _Step:
    """One step of a StepDisplay."""

    def __init__(self, name: str, unit: str, line, log_every: float, clock: Clock, origin: float | None):
        self.name, self.unit, self.line, self.log_every, self.clock = name, unit, line, log_every, clock
        self.done, self.total = 0, None
        self.started = self.last_log = clock()
        self.origin = self.started if origin is None else origin  # the live line's elapsed counts from here
        self.meter = Meter(clock)
        self.logged = False  # a periodic line was printed: the step was long enough to report its end

    def set(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total
        self.meter.add(done)
        now = self.clock()
        if self.line is not None:
            width = terminal.line_width(self.line.stream)
            rate = self.meter.rate()
            eta = self.meter.eta(total) if total else None
            self.line.update(meter_line(self.name, done, total, now - self.origin, rate, self.unit, "", width, eta))
        if now - self.last_log >= self.log_every:
            self.last_log = now
            self._log("progress", periodic=True)

    def close(self) -> None:
        self._log("finished", periodic=False)

    def _log(self, what: str, periodic: bool) -> None:
        secs = max(self.clock() - self.started, 1e-9)
        total = f"/{amount(self.total, self.unit)}" if self.total else ""
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        rate = f", {amount(self.done / secs, self.unit)}/s" if self.done else ""
        text = f"{self.name}: {what} {amount(self.done, self.unit)}{total}{pct} in {secs:.0f}s{rate}"
        if self.line is not None:
            quiet.log_only(text)  # the live line shows it
        elif periodic or self.logged:
            self.logged = True
            quiet.say(text)
        else:
            from loguru import logger

            logger.info(text)  # a short step: log files (and -v) only


class StepDisplay:
    """A ``shards.steps`` callback: one line per step name, the previous closed when a new one starts."""

    def __init__(self, unit: str = "B", *, terminal: bool | None = None, log_every: float = LOG_EVERY_SECS,
                 clock: Clock = time.monotonic, stream: Any = None, started: float | None = None):  # fmt: skip
        self.unit, self.log_every, self.clock, self.stream, self.started = unit, log_every, clock, stream, started
        self.live = live(terminal)
        self.step: _Step | None = None
        self._line_cm = contextlib.ExitStack()
        self._line: terminal.LiveLine | None = None

    def __call__(self, step: str, done: int, total: int | None) -> None:
        if self.step is None or self.step.name != step:
            self._close_step()
            if self.live and self._line is None:
                self._line = self._line_cm.enter_context(terminal.live_line(self.stream))
            self.step = _Step(step, self.unit, self._line, self.log_every, self.clock, self.started)
        self.step.set(done, total)

    def _close_step(self) -> None:
        if self.step is not None:
            self.step.close()
            self.step = None

    def close(self) -> None:
        self._close_step()
        self._line_cm.close()
        self._line = None

    def __enter__(self) -> StepDisplay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
