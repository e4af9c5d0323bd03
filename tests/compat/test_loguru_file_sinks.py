"""compat.loguru_file_sinks: its self-check passes against the installed loguru, and a wrapped
file sink on a full disk (``/dev/full``) reports its first error once and raises nothing after
(an upgrade that moves the internal fails here, naming it)."""

from __future__ import annotations

import os

import pytest
from loguru import logger

from data_juicer_elastic.compat import loguru_file_sinks


def test_self_check():
    assert "FileSink" in loguru_file_sinks.self_check()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_wrapped_file_sink_on_a_full_disk_reports_once_and_never_raises(capfd):
    handler_id = logger.add("/dev/full", level="INFO", format="{message}", catch=False)  # unwrapped: it would raise
    seen = []
    try:
        assert loguru_file_sinks.tolerate_write_errors(lambda path, exc: seen.append((path, exc.errno))) >= 1
        assert loguru_file_sinks.tolerate_write_errors(lambda path, exc: seen.append("again")) == 0, "wrapped once"
        for i in range(5):
            logger.info(f"record {i}")
    finally:
        logger.remove(handler_id)  # the final flush: nothing raised either
    assert seen == [("/dev/full", 28)]
    assert "Logging error" not in capfd.readouterr().err
