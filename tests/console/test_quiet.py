"""The quiet console: what reaches the user's terminal, and what only the log files get."""

from __future__ import annotations

import io
import logging
import sys

import pytest
from loguru import logger

from data_juicer_elastic.console import quiet


@pytest.fixture
def console(monkeypatch):
    """install_console() onto a StringIO standing for stderr; loguru's handlers restored after."""
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    stream = io.StringIO()
    monkeypatch.setattr(quiet.sys, "stderr", stream)
    logger.remove()
    logger.add(stream, level="INFO")  # what Data-Juicer's setup_logger leaves: a stderr sink
    files = io.StringIO()
    logger.add(files, level="INFO", format="{message}")
    quiet.install_console()
    yield stream, files
    logger.remove()
    logger.add(sys.__stderr__)  # loguru's default handler, as other tests expect it
    quiet._sink_id = None
    quiet.set_console_stream(None)


def test_quiet_shows_our_lines_warnings_and_errors_only(console):
    stream, files = console
    quiet.say("prepared the job")
    logger.info("Loading dataset with Ray...")  # Data-Juicer's per-shard chatter
    quiet.log_only("progress: 1/2 rows")
    logger.warning("an operator warns")
    logger.error("an operator failed")
    shown = stream.getvalue()
    assert "prepared the job" in shown and "an operator warns" in shown and "an operator failed" in shown
    assert "Loading dataset" not in shown and "progress: 1/2" not in shown
    logged = files.getvalue()  # the log files get every line
    for text in ("prepared the job", "Loading dataset", "progress: 1/2", "an operator warns", "an operator failed"):
        assert text in logged


def test_install_is_idempotent_and_replaces_the_stderr_sink(console):
    stream, _ = console
    quiet.install_console()
    quiet.install_console()
    quiet.say("once")
    assert stream.getvalue().count("once") == 1


def test_repeated_warnings_fold_into_one_line_and_known_noise_is_dropped():
    rule = quiet.ConsoleFilter()

    def record(name, message, level="WARNING"):
        no = {"INFO": 20, "WARNING": 30, "ERROR": 40}[level]
        return {"extra": {}, "level": type("L", (), {"no": no})(), "name": name, "message": message}

    neither = "Neither the required cuda memory nor gpu of Op[{}] is specified. Set the `num_gpus` to 1 now."
    first = record("data_juicer.utils.process_utils", neither.format("a_mapper"))
    assert rule(first) and "shown once" in first["extra"]["folded"]
    assert not rule(record("data_juicer.utils.process_utils", neither.format("b_filter")))
    assert not rule(record("data_juicer.config.config", "No config file found in work directory: /x"))
    # the demo's one warning: advice about num_cpus for every operator of every shard, in the log files only
    cpus = "Neither the required memory nor cpu of Op[a_mapper] is specified. We recommend specifying the `num_cpus`"
    assert not rule(record("data_juicer.utils.process_utils", cpus))
    assert rule(record("data_juicer.utils.process_utils", cpus, level="ERROR"))
    assert rule(record("data_juicer.config.config", "something else"))
    assert rule(record("data_juicer.utils.process_utils", neither.format("c"), level="ERROR")), "never an error"
    assert not rule(record("data_juicer.core", "Initializing Ray ...", level="INFO"))
    assert rule(record("data_juicer.utils.lazy_loader", "Installing torch using uv...", level="INFO"))
    assert quiet.ConsoleFilter(show_all=True)(record("data_juicer.core", "Initializing Ray ...", level="INFO"))


def test_verbose_shows_everything(console, monkeypatch):
    stream, _ = console
    monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
    quiet.install_console()
    logger.info("Loading dataset with Ray...")
    quiet.log_only("progress: 1/2 rows")  # what the live line shows stays out even then
    assert "Loading dataset with Ray" in stream.getvalue()
    assert "progress: 1/2" not in stream.getvalue()


def test_ray_console_handlers_keep_warnings_but_drop_info_and_known_noise(monkeypatch):
    name = "dj_elastic_test_ray"
    log = logging.getLogger(name)
    out, kept = io.StringIO(), io.StringIO()
    monkeypatch.setattr(quiet.sys, "stderr", out)  # Ray's handler keeps the stderr it was made with
    quiet.set_console_stream(out)
    console_handler, file_handler = logging.StreamHandler(out), logging.FileHandler("/dev/null")
    file_handler.stream = kept  # a file handler: the session log, never filtered
    log.addHandler(console_handler)
    log.addHandler(file_handler)
    log.setLevel(logging.INFO)
    try:
        quiet.quiet_ray_logging(name)
        quiet.quiet_ray_logging(name)  # idempotent
        log.info("Connecting to existing Ray cluster")
        log.warning("Token authentication is enabled for this Ray cluster.")
        log.warning("a real warning")
        log.error("a real error")
    finally:
        log.removeHandler(console_handler)
        log.removeHandler(file_handler)
    quiet.set_console_stream(None)
    assert out.getvalue().splitlines() == ["a real warning", "a real error"]
    assert "Connecting" in kept.getvalue() and "Token" in kept.getvalue()
    assert len(console_handler.filters) == 1
    assert isinstance(console_handler.stream, quiet.ConsoleWriter), "through the live-line-aware writer"
