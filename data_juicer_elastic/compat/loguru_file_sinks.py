"""loguru 0.7: the file sinks of the global logger (``loguru._file_sink.FileSink``, found through
``loguru_handlers``: ``write``, ``stop``, ``_path``, ``_file``), made to fail quietly and once.

On a full or read-only filesystem loguru prints "--- Logging error in Loguru Handler ---" and a
traceback for every record (docs/failure-semantics.md, row 23); a wrapped sink's first failing
write closes the file and calls ``on_error(path, exc)``, later records are dropped.  loguru has no
public hook for a sink's errors (``catch=False`` would raise them into every logging call).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.compat.loguru_handlers import REQUIREMENT, handlers
from data_juicer_elastic.errors import IntegrationError

TARGET: Final = "loguru._file_sink.FileSink"
_MARK: Final = "__dj_elastic_tolerant__"

OnError = Callable[[str, OSError], None]


def _file_sinks() -> dict[int, Any]:
    """The file sinks of the global logger now, by handler id (none if loguru moved ``FileSink``
    or its handler table: ``self_check`` says so)."""
    try:
        from loguru._file_sink import FileSink
    except ImportError:  # pragma: no cover - loguru moved it
        return {}
    return {view.handler_id: view.sink for view in handlers() if isinstance(view.sink, FileSink)}


def tolerate_write_errors(on_error: OnError) -> int:
    """Wrap every file sink of the global logger not wrapped yet; how many were wrapped."""
    unwrapped = [sink for sink in _file_sinks().values() if not getattr(sink, _MARK, False)]
    for sink in unwrapped:
        _wrap(sink, on_error)
    return len(unwrapped)


def remove_file_sinks() -> None:
    """Remove (close, and compress as configured) every file sink of the global logger."""
    for handler_id in _file_sinks():
        with contextlib.suppress(ValueError):  # removed meanwhile
            logger.remove(handler_id)


def _wrap(sink: Any, on_error: OnError) -> None:
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


def self_check() -> str:
    with tempfile.TemporaryDirectory() as directory:
        handler_id = logger.add(Path(directory) / "check.log", level="CRITICAL")
        try:
            sink = _file_sinks().get(handler_id)
            parts = sink is not None and all(callable(getattr(sink, name, None)) for name in ("write", "stop"))
            if not (parts and isinstance(getattr(sink, "_path", None), str) and hasattr(sink, "_file")):
                raise IntegrationError(
                    f"{TARGET}: a file sink no longer has write, stop, _path and _file",
                    where=TARGET,
                    hint=f"install {REQUIREMENT}",
                )
        finally:
            logger.remove(handler_id)
    return f"{TARGET} found (write, stop, _path, _file)"
