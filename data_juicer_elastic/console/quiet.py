"""What reaches the user's console, quiet by default; ``-v`` / ``DJ_ELASTIC_VERBOSE=1`` shows everything.

Every line still goes to the log files; only the console sink is filtered.  Quiet, it shows the
plugin's own lines (:func:`say`) and the live line, every ERROR and CRITICAL, Data-Juicer's lazy
loader installing a package, and warnings except known ones with nothing actionable
(:data:`_DROPPED`; those every shard repeats, :data:`_FOLDED`, once).  Ray's ``logging`` console
handlers get the same rule, and Ray Data's progress bars are off: the live line replaces them.

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
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any, Final, TextIO

from loguru import logger

from data_juicer_elastic.compat import importlib_deferred as deferred
from data_juicer_elastic.compat import loguru_internals, ray_internals

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


VERBOSE_ENV: Final = "DJ_ELASTIC_VERBOSE"
# Set by the elastic commands (quiet): Ray workers they start inherit it (see quiet_ray_worker).
QUIET_WORKERS_ENV: Final = "DJ_ELASTIC_QUIET_WORKERS"
CONSOLE: Final = "console"  # loguru ``extra`` key: True = always on the console, False = log files only
# Data-Juicer's own format (utils/logger_utils.py), kept for the verbose console.
VERBOSE_FORMAT: Final = (
    "<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> | <level>{level: <8}</level> | "
    "<cyan>{name}</cyan>:<cyan>{line}</cyan> - <level>{message}</level>\n{exception}"
)

# (logger name prefix, message pattern): warnings caused by how the plugin drives Data-Juicer,
# with nothing for the user to do.  The driver of an elastic job runs no operator itself.
_DROPPED: Final = (
    ("data_juicer.config.config", re.compile(r"No config file found in work directory")),
    ("data_juicer.config.config", re.compile(r"Number of processes `np` is set as")),
    # advice to size each operator's Ray tasks (`num_cpus`) for every operator of every shard; the shards run
    # as they do without it (Data-Juicer sizes them itself), so the log files keep it, the console does not
    ("data_juicer.utils.process_utils", re.compile(r"Neither the required memory nor cpu of Op\[")),
    # a shard's key path Data-Juicer would split on spaces is given to it shell-quoted (execution.shard_runner)
    (
        "data_juicer.config.config",
        re.compile(r"dataset_path \['.*/attempts/part-\d+-of-\d+/.*/input\.jsonl.*'\] is not a valid"),
    ),
)
# Warnings repeated for every operator of every shard: the first is shown, with a note.
_FOLDED: Final = (
    (
        "data_juicer.utils.process_utils",
        re.compile(r"Neither the required cuda memory nor gpu of Op\[.*\] is specified"),
        "repeated for every operator and shard; shown once, all of them are in the log",
    ),
)
# INFO lines that must reach the console anyway: Data-Juicer's lazy loader pip-installing a
# package (possibly gigabytes, e.g. torch) says so only at INFO.
_ALWAYS: Final = (("data_juicer.utils.lazy_loader", re.compile(r"Installing |installed|uv not found")),)
_RAY_NOISE: Final = (
    "Token authentication is enabled",  # a private node-local runtime: nothing to opt out of
    "Truncating long operator name",
    "Progress bars disabled",  # we turned them off: the live line shows progress
    # Ray started on a helper thread while the job is scanned: the worker handles SIGTERM itself
    "SIGTERM handler is not set because current thread is not the main thread",
    # a runtime whose CPUs the warm operator actors hold between shards (ray_num_cpus: 1); a shard that
    # really waits for CPUs makes no progress, and stall_timeout_secs restarts the runtime
    "currently does not have any available CPUs",
    "Cluster resources are not enough to run any task",  # the same, said by Ray Data's resource manager
)

_sink_id: int | None = None


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def set_verbose() -> None:
    """``-v``: inherited by child processes too (slots, Ray workers)."""
    os.environ[VERBOSE_ENV] = "1"


def say(message: str) -> None:
    """A line for the user: on the console even when quiet (and in the log files)."""
    logger.bind(**{CONSOLE: True}).opt(depth=1).info(message)


def log_only(message: str) -> None:
    """A line for the log files only, never on the console (e.g. what the live line shows)."""
    logger.bind(**{CONSOLE: False}).opt(depth=1).info(message)


class ConsoleFilter:
    """The quiet rule of the module docstring, as a loguru filter."""

    def __init__(self, show_all: bool = False):
        self.show_all = show_all
        self.folded: set[int] = set()

    def __call__(self, record: dict[str, Any]) -> bool:
        marked = record["extra"].get(CONSOLE)
        if marked is not None:
            return bool(marked)
        if self.show_all or record["level"].no >= logging.ERROR:
            return True
        name, message = record["name"] or "", str(record["message"])
        if record["level"].no < logging.WARNING:
            return _always_shown(name, message)
        if any(name.startswith(prefix) and pattern.search(message) for prefix, pattern in _DROPPED):
            return False
        for k, (prefix, pattern, note) in enumerate(_FOLDED):
            if name.startswith(prefix) and pattern.search(message):
                if k in self.folded:
                    return False
                self.folded.add(k)
                record["extra"]["folded"] = note
        return True


def _always_shown(name: str, message: str) -> bool:
    return any(name.startswith(prefix) and pattern.search(message) for prefix, pattern in _ALWAYS)


def _worker_filter(record: dict[str, Any]) -> bool:
    return record["level"].no >= logging.WARNING or _always_shown(record["name"] or "", str(record["message"]))


def _quiet_format(record: dict[str, Any]) -> str:
    folded = " <dim>({extra[folded]})</dim>" if "folded" in record["extra"] else ""
    if record["extra"].get(CONSOLE) or record["level"].no < logging.WARNING:
        return "<dim>{time:HH:mm:ss}</dim> {message}" + folded + "\n"
    return "<dim>{time:HH:mm:ss}</dim> <level>{level}</level> <dim>{name}:</dim> {message}" + folded + "\n"


def install_console() -> None:
    """Route loguru's console output through :func:`write`, filtered unless verbose: replaces
    every loguru handler that writes to stderr (Data-Juicer's ``setup_logger`` and its package import
    each add one; call again after either, idempotent); the log file sinks stay."""
    global _sink_id
    stream, level = _remove_stderr_handlers()
    set_console_stream(stream)
    quiet = not verbose()
    _sink_id = logger.add(
        write,
        level=level,
        format=_quiet_format if quiet else VERBOSE_FORMAT,
        filter=ConsoleFilter(show_all=not quiet),
        colorize=is_terminal(stream),
        backtrace=False,
        diagnose=False,  # never variable values (row contents) on the console
    )
    if quiet:
        deferred.when_imported("ray", lambda _module: quiet_ray_logging("ray"))
        deferred.when_imported("ray.data", _quiet_ray_data)


def _remove_stderr_handlers() -> tuple[Any, int]:
    """Remove loguru's stderr handlers (and ours); (the stream they wrote to, their lowest level)."""
    stream, level = None, logging.INFO
    found = []
    for handler in loguru_internals.handlers():
        target = handler.stream
        if (
            handler.handler_id == _sink_id
            or handler.name == "<stderr>"
            or target is not None
            and (target is sys.__stderr__ or target is sys.stderr)
        ):
            found.append(handler.handler_id)
            if handler.handler_id != _sink_id:
                stream = target if target is not None else stream
                level = min(level, handler.levelno if handler.levelno is not None else level)
    for handler_id in found:
        with contextlib.suppress(ValueError):  # removed meanwhile
            logger.remove(handler_id)
    if stream is None or _is_log_stream(stream):
        stream = console_stream() if stream is None else sys.__stderr__
    return stream, level


def quiet_from_start(elastic: bool) -> None:
    """In the driver of an elastic run (``elastic``), quiet from the entry point on: Data-Juicer logs
    its plugin discovery (an INFO line in its own format) before its set-up calls ``setup_logger``,
    which the plugin's console replaces.  Data-Juicer's ``setup_logger`` removes every handler, so a
    run that turns out not to be elastic gets Data-Juicer's console from then on, as without it."""
    if elastic and not verbose():
        install_console()


def mark_quiet_workers() -> None:
    """Called by ``dj-process`` (elastic) and ``dj-elastic`` before any Ray runtime starts."""
    if verbose():
        os.environ.pop(QUIET_WORKERS_ENV, None)
    else:
        os.environ[QUIET_WORKERS_ENV] = "1"


def quiet_ray_worker() -> None:
    """In a Ray worker of a quiet elastic job (only where the driver asked for it): Data-Juicer's INFO
    lines off its stderr.  Ray forwards every worker's output to the driver's console, and each worker
    logs Data-Juicer's plugin discovery: dozens of lines on a big node.  Warnings and errors still go through.
    """
    if os.environ.get(QUIET_WORKERS_ENV) != "1" or not ray_internals.is_ray_worker():
        return
    stream, _ = _remove_stderr_handlers()
    logger.add(stream, level="INFO", filter=_worker_filter)


class _RayConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        return record.levelno >= logging.WARNING and not any(n in record.getMessage() for n in _RAY_NOISE)


def quiet_ray_logging(name: str) -> None:
    """Filter the console handlers (not the session log files) of the ``name`` logger, and send
    what they still print through the console writer, so it scrolls above the live line."""
    for handler in logging.getLogger(name).handlers:
        is_console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if not is_console or any(isinstance(f, _RayConsoleFilter) for f in handler.filters):
            continue
        handler.addFilter(_RayConsoleFilter())
        if handler.stream in (sys.stderr, sys.__stderr__):  # created with stderr: the console
            handler.setStream(ConsoleWriter())


def _quiet_ray_data(module: Any) -> None:
    quiet_ray_logging("ray.data")
    context = module.DataContext.get_current()
    context.enable_progress_bars = False  # progress is the live line's; Ray's bars would tear it
