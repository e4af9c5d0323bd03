"""The user's terminal: where console output goes, and one live status line kept below it.

The console stream is chosen once, when the console is installed (Data-Juicer swaps ``sys.stderr``
for a stream feeding its logger that says ``isatty() == False``, or briefly for a capture buffer):
that moment's ``sys.stderr``, unless it is such a logger stream, then ``sys.__stderr__``.

The live line is drawn with ``\\r`` and ``ESC [K``; while it is shown, all other output goes
through :meth:`LiveLine.write_above` (clear, write, redraw), so log lines scroll above it.
Output we do not write (Ray's handlers, ``print``) goes to ``sys.stderr``/``sys.stdout``: those
are guarded by a proxy while a line is shown.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, Final, TextIO

CLEAR_LINE: Final = "\r\x1b[K"
FALLBACK_COLUMNS: Final = 100  # a pty whose size was never set (script, CI runners) reports 0 columns

_lock = threading.RLock()
_console_stream: TextIO | None = None
_line: LiveLine | None = None


def _is_log_stream(stream: Any) -> bool:
    """Data-Juicer's ``StreamToLoguru``: writing to it would feed the logger back into itself."""
    return type(stream).__name__ == "StreamToLoguru"


def console_stream() -> TextIO:
    """The stream console output goes to (fixed by :func:`set_console_stream`, else chosen now)."""
    if _console_stream is not None:
        return _console_stream
    stream = sys.stderr
    return sys.__stderr__ if stream is None or _is_log_stream(stream) else stream


def set_console_stream(stream: TextIO | None) -> None:
    global _console_stream
    _console_stream = stream


def is_terminal(stream: Any = None) -> bool:
    stream = console_stream() if stream is None else stream
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def line_width(stream: Any) -> int:
    try:
        found = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        found = 0
    return found if found > 0 else FALLBACK_COLUMNS


def write(text: str) -> None:
    """Write ``text`` to the console, above the live line when one is shown."""
    with _lock:
        if _line is not None:
            _line.write_above(text)
            return
        stream = console_stream()
    stream.write(text)
    stream.flush()


class ConsoleWriter:
    """A stream for handlers that keep their own reference to stderr (Ray's ``logging`` console
    handlers hold the stream they were created with): their lines go through :func:`write`."""

    def write(self, text: str) -> int:
        write(text)
        return len(text)

    def flush(self) -> None:
        console_stream().flush()

    def isatty(self) -> bool:
        return is_terminal()


class LiveLine:
    """One status line on a terminal, redrawn in place; see the module docstring."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.text = ""
        self.shown = False  # drawn and not cleared since

    def update(self, text: str) -> None:
        with _lock:
            self.text = text[: line_width(self.stream) - 1]  # never wrap: a wrapped line cannot be redrawn
            self._draw()

    def write_above(self, text: str) -> None:
        with _lock:
            self._clear()
            self.stream.write(text)
            if text.endswith("\n"):  # a partial line stays open until its end arrives
                self._draw()
            self.stream.flush()

    def close(self) -> None:
        with _lock:
            self._clear()
            self.text = ""
            self.stream.flush()

    def _draw(self) -> None:
        if self.text:
            self.stream.write(CLEAR_LINE + self.text)
            self.stream.flush()
            self.shown = True

    def _clear(self) -> None:
        if self.shown:
            self.stream.write(CLEAR_LINE)
            self.shown = False


class _Guarded:
    """``sys.stderr``/``sys.stdout`` while a live line is shown: writes go above the line."""

    def __init__(self, stream: TextIO, line: LiveLine):
        self._stream, self._line = stream, line

    def write(self, text: str) -> int:
        self._line.write_above(text)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding... of the real stream
        return getattr(self._stream, name)


@contextlib.contextmanager
def live_line(stream: TextIO | None = None) -> Iterator[LiveLine]:
    """A live line on ``stream`` (default: the console) for the block; nested blocks share it."""
    global _line
    stream = console_stream() if stream is None else stream
    with _lock:
        outer = _line
        if outer is not None:
            line, guards = outer, []
        else:
            line = _line = LiveLine(stream)
            guards = _guard(stream, line)
    try:
        yield line
    finally:
        with _lock:
            if outer is None:
                line.close()
                _unguard(guards)
                _line = None


def _guard(stream: TextIO, line: LiveLine) -> list[tuple[str, Any, _Guarded]]:
    guards = []
    for name in ("stderr", "stdout"):
        current = getattr(sys, name)
        # Only streams that end on the same terminal; a redirected stdout is left alone.
        if current is stream or (current is not None and is_terminal(current) and _same_tty(current, stream)):
            proxy = _Guarded(current, line)
            setattr(sys, name, proxy)
            guards.append((name, current, proxy))
    return guards


def _unguard(guards: list[tuple[str, Any, _Guarded]]) -> None:
    for name, original, proxy in guards:
        if getattr(sys, name) is proxy:  # someone replaced it since: leave theirs
            setattr(sys, name, original)


def _same_tty(a: Any, b: Any) -> bool:
    try:
        return os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (AttributeError, ValueError, OSError):
        return False
