"""loguru 0.7: the handlers of the global logger (``loguru.logger._core.handlers``) and, on each,
``_name`` (``"<stderr>"`` for the default one), ``_sink`` (``loguru_file_sinks`` looks there),
``_sink._stream`` and ``levelno``: the quiet console (``console.quiet``) replaces exactly
Data-Juicer's stderr handlers, on the same stream and level; loguru cannot list handlers publicly.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.errors import IntegrationError

TARGET: Final = "loguru.logger._core.handlers"
REQUIREMENT: Final = "loguru>=0.7,<0.8"


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


def self_check() -> str:
    handler_id = logger.add(sys.__stderr__, level="CRITICAL")  # the real stream: its name is "<stderr>"
    try:
        found = [view for view in handlers() if view.handler_id == handler_id]
    finally:
        logger.remove(handler_id)
    if not found or found[0].stream is not sys.__stderr__ or found[0].name != "<stderr>" or found[0].levelno != 50:
        raise IntegrationError(
            f"{TARGET}: a stderr handler no longer shows its name, stream and level",
            where=TARGET,
            hint=f"install {REQUIREMENT}",
        )
    return f"{TARGET} found (name, stream, level of each handler)"
