"""loguru 0.7: the handlers of the global logger and its file sinks, which loguru cannot list
publicly, read by the quiet console and made to fail quietly on a full disk.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.errors import IntegrationError

LOGURU_REQUIREMENT: Final = "loguru>=0.7,<0.8"

# --- The handlers of the global logger (``loguru.logger._core.handlers``) and, on each, ``_name``
# (``"<stderr>"`` for the default one), ``_sink`` (the file sinks below look there),
# ``_sink._stream`` and ``levelno``: the quiet console (``console.quiet``) replaces exactly
# Data-Juicer's stderr handlers, on the same stream and level.

HANDLERS: Final = "loguru.logger._core.handlers"


@dataclass(frozen=True)
class HandlerView:
    """What the console needs to know of one handler."""

    handler_id: int
    name: str | None  # "<stderr>" for loguru's default handler
    stream: Any  # the stream a stream sink writes to; None for other sinks
    levelno: int | None
    sink: Any  # loguru's sink object (its ``_sink``); None if loguru changed its internals


def handlers() -> list[HandlerView]:
    """Every handler of the global logger now (an empty list if loguru changed its internals:
    the console then adds its line beside them instead of replacing them)."""
    table = getattr(getattr(logger, "_core", None), "handlers", None) or {}
    return [
        HandlerView(
            handler_id,
            getattr(handler, "_name", None),
            getattr(getattr(handler, "_sink", None), "_stream", None),
            getattr(handler, "levelno", None),
            getattr(handler, "_sink", None),
        )
        for handler_id, handler in list(table.items())
    ]


def check_loguru_handlers() -> str:
    handler_id = logger.add(sys.__stderr__, level="CRITICAL")  # the real stream: its name is "<stderr>"
    try:
        found = [view for view in handlers() if view.handler_id == handler_id]
    finally:
        logger.remove(handler_id)
    if not found or found[0].stream is not sys.__stderr__ or found[0].name != "<stderr>" or found[0].levelno != 50:
        raise IntegrationError(
            f"{HANDLERS}: a stderr handler no longer shows its name, stream and level",
            where=HANDLERS,
            hint=f"install {LOGURU_REQUIREMENT}",
        )
    return f"{HANDLERS} found (name, stream, level of each handler)"


# --- The file sinks of the global logger (``loguru._file_sink.FileSink``, found through the handlers:
# ``write``, ``stop``, ``_path``, ``_file``), made to fail quietly and once.  On a full or read-only
# filesystem loguru prints "--- Logging error in Loguru Handler ---" and a traceback for every record
# (docs/failure-semantics.md, row 23); a wrapped sink's first failing write closes the file and calls
# ``on_error(path, exc)``, later records are dropped.  loguru has no public hook for a sink's errors
# (``catch=False`` would raise them into every logging call).

FILE_SINK: Final = "loguru._file_sink.FileSink"
_MARK: Final = "__dj_elastic_tolerant__"

OnError = Callable[[str, OSError], None]


def _file_sinks() -> dict[int, Any]:
    """The file sinks of the global logger now, by handler id (none if loguru moved ``FileSink``
    or its handler table: ``check_loguru_file_sinks`` says so)."""
    try:
        from loguru._file_sink import FileSink
    except ImportError:  # pragma: no cover - loguru moved it
        return {}
    return {view.handler_id: view.sink for view in handlers() if isinstance(view.sink, FileSink)}


def tolerate_write_errors(on_error: OnError) -> int:
    """Wrap every file sink of the global logger not wrapped yet; how many were wrapped."""
    unwrapped = [sink for sink in _file_sinks().values() if not getattr(sink, _MARK, False)]
    for sink in unwrapped:
        _wrap_sink(sink, on_error)
    return len(unwrapped)


def remove_file_sinks() -> None:
    """Remove (close, and compress as configured) every file sink of the global logger."""
    for handler_id in _file_sinks():
        with contextlib.suppress(ValueError):  # removed meanwhile
            logger.remove(handler_id)


def _wrap_sink(sink: Any, on_error: OnError) -> None:
    write, stop = sink.write, sink.stop
    path = str(getattr(sink, "_path", "") or "<log file>")
    failed = False

    def tolerant(call: Callable[..., None]) -> Callable[..., None]:
        def guarded(*args: Any) -> None:
            nonlocal failed
            if failed:
                return
            try:
                call(*args)
            except OSError as exc:
                failed = True
                handle = getattr(sink, "_file", None)
                with contextlib.suppress(OSError, ValueError):
                    if handle is not None:
                        handle.close()  # flushes (fails again) and closes the descriptor anyway
                on_error(path, exc)

        return guarded

    sink.write, sink.stop = tolerant(write), tolerant(stop)
    setattr(sink, _MARK, True)


def check_loguru_file_sinks() -> str:
    with tempfile.TemporaryDirectory() as directory:
        handler_id = logger.add(Path(directory) / "check.log", level="CRITICAL")
        try:
            sink = _file_sinks().get(handler_id)
            parts = sink is not None and all(callable(getattr(sink, name, None)) for name in ("write", "stop"))
            if not (parts and isinstance(getattr(sink, "_path", None), str) and hasattr(sink, "_file")):
                raise IntegrationError(
                    f"{FILE_SINK}: a file sink no longer has write, stop, _path and _file",
                    where=FILE_SINK,
                    hint=f"install {LOGURU_REQUIREMENT}",
                )
        finally:
            logger.remove(handler_id)
    return f"{FILE_SINK} found (write, stop, _path, _file)"
