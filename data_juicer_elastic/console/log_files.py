"""Log files that never stop a run: a full or read-only filesystem under one costs its lines.

A loguru sink whose file cannot be written prints a traceback for every later record, and its
flush on removal raises out of the run's own ``finally``: a full job directory would end
``dj-process`` with exit 1 and dozens of tracebacks instead of its one storage error.  So the
plugin's own log files (:class:`LogFile`) and Data-Juicer's file sinks (:func:`guard_file_sinks`)
fail quietly and once: one console line, later lines dropped; what needs the filesystem reports
its own error.  That line is written to the terminal directly, not through the logger: a sink
that logged from inside its own failed write would re-enter loguru's lock.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import IO

from data_juicer_elastic.compat import loguru_internals
from data_juicer_elastic.console import quiet

_reported: set[str] = set()
_report_lock = threading.Lock()


def report_broken(path: str | os.PathLike, what: str, exc: BaseException) -> None:
    """One console line the first time the log file at ``path`` cannot be written."""
    key = os.path.abspath(os.fspath(path))
    with _report_lock:
        if key in _reported:
            return
        _reported.add(key)
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    with contextlib.suppress(OSError, ValueError):  # not even the console: nothing more to do
        quiet.write(
            f"{time.strftime('%H:%M:%S')} WARNING {what} {key} cannot be written ({reason}); "
            "its lines are dropped from now on\n"
        )


class LogFile:
    """An append-only text file for a loguru sink or a ``logging.StreamHandler``; never raises.
    ``what`` names it in the one console line written when it fails (``"the instance log"``)."""

    def __init__(self, path: str | os.PathLike, what: str):
        self.path, self.what = Path(path), what
        self.name = str(self.path)  # how loguru names the sink
        self.failed: OSError | None = None
        self._lock = threading.Lock()
        self._stream: IO[str] | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._stream = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed by stop()
        except OSError as exc:
            self._fail(exc)

    def write(self, text: str) -> int:
        with self._lock:
            if self._stream is not None:
                try:
                    self._stream.write(text)
                except OSError as exc:
                    self._fail(exc)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._stream is not None:
                try:
                    self._stream.flush()
                except OSError as exc:
                    self._fail(exc)

    def stop(self) -> None:
        """Close it (loguru calls this when the sink is removed)."""
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except OSError as exc:
                self.failed = exc
                report_broken(self.path, self.what, exc)

    close = stop

    def _fail(self, exc: OSError) -> None:  # with the lock held, or from __init__
        self.failed = exc
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(OSError):  # the close flushes what is buffered: fails again, and closes
                stream.close()
        report_broken(self.path, self.what, exc)


def guard_file_sinks() -> None:
    """Every loguru file sink of this process (Data-Juicer's) fails quietly and once, as a
    :class:`LogFile` does; call after Data-Juicer set its logger up (idempotent)."""
    loguru_internals.tolerate_write_errors(lambda path, exc: report_broken(path, "Data-Juicer's log file", exc))


def close_log_sinks() -> None:
    """The run is over with an error: the log files are closed now (queued records written,
    Data-Juicer's files compressed), so what they report comes before the one error line."""
    from loguru import logger

    with contextlib.suppress(OSError, ValueError):  # a sink outside this package's care
        logger.complete()
        loguru_internals.remove_file_sinks()
