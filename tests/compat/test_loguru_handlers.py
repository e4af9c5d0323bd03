"""compat.loguru_handlers: the global logger's handlers, read through loguru's internals."""

from __future__ import annotations

import io

from loguru import logger

from data_juicer_elastic.compat import loguru_handlers


def test_self_check_finds_loguru_internals():
    assert "found" in loguru_handlers.self_check()


def test_a_stream_handler_shows_its_stream_and_level():
    stream = io.StringIO()
    handler_id = logger.add(stream, level="WARNING")
    try:
        view = next(h for h in loguru_handlers.handlers() if h.handler_id == handler_id)
    finally:
        logger.remove(handler_id)
    assert view.stream is stream and view.levelno == 30
    assert handler_id not in [h.handler_id for h in loguru_handlers.handlers()]
