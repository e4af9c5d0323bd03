"""compat.loguru_internals: the global logger's handlers and file sinks, read through
loguru's internals (an upgrade that moves them fails here, naming it)."""

from __future__ import annotations

import io
import os

import pytest
from loguru import logger

from data_juicer_elastic.compat import loguru_internals


def test_self_check_finds_loguru_internals():
    assert "found" in loguru_internals.check_loguru_handlers()


def test_a_stream_handler_shows_its_stream_and_level():
    stream = io.StringIO()
    handler_id = logger.add(stream, level="WARNING")
    try:
        view = next(h for h in loguru_internals.handlers() if h.handler_id == handler_id)
    finally:
        logger.remove(handler_id)
    assert view.stream is stream and view.levelno == 30
    assert handler_id not in [h.handler_id for h in loguru_internals.handlers()]


def test_check_loguru_file_sinks():
    assert "FileSink" in loguru_internals.check_loguru_file_sinks()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_wrapped_file_sink_on_a_full_disk_reports_once_and_never_raises(capfd):
    handler_id = logger.add("/dev/full", level="INFO", format="{message}", catch=False)  # unwrapped: it would raise
    seen = []
    try:
        assert loguru_internals.tolerate_write_errors(lambda path, exc: seen.append((path, exc.errno))) >= 1
        assert loguru_internals.tolerate_write_errors(lambda path, exc: seen.append("again")) == 0, "wrapped once"
        for i in range(5):
            logger.info(f"record {i}")
    finally:
        logger.remove(handler_id)  # the final flush: nothing raised either
    assert seen == [("/dev/full", 28)]
    assert "Logging error" not in capfd.readouterr().err
