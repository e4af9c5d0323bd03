"""console.log_files: a log file on a full disk (``/dev/full``: every write is ENOSPC) costs its
lines, reported once on the console, and never raises into the run: neither while logging, nor
when its sink is removed (the flush that ended a full job's ``dj-process`` with a traceback)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from loguru import logger

from data_juicer_elastic.console import log_files
from data_juicer_elastic.execution.shard_runner import attempt_log
from data_juicer_elastic.job_run import instance_log

FULL = Path("/dev/full")
pytestmark = pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full here")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_reports(monkeypatch):
    monkeypatch.setattr(log_files, "_reported", set())
    lines: list[str] = []
    monkeypatch.setattr(log_files.quiet, "write", lines.append)
    return lines


def test_the_instance_log_on_a_full_disk_never_raises_and_says_so_once(fresh_reports):
    with instance_log(FULL):
        for i in range(50):
            logger.info(f"line {i} " + "x" * 200)
    assert len(fresh_reports) == 1
    assert "the instance log /dev/full cannot be written (No space left on device)" in fresh_reports[0]


def test_the_attempt_log_on_a_full_disk_takes_ray_data_lines_too(fresh_reports, monkeypatch):
    # Only the attempt log's handler: Ray's own console handler (installed on "ray.data" once Ray Data is
    # imported, and routed through the console writer by the quiet console) would print the line too.
    monkeypatch.setattr(logging.getLogger("ray.data"), "handlers", [])
    with attempt_log(FULL):
        logger.info("a Data-Juicer line")
        logging.getLogger("ray.data").warning("a Ray Data line")  # a logging.StreamHandler on the same file
    assert len(fresh_reports) == 1 and "the attempt log" in fresh_reports[0]


def test_a_log_file_that_cannot_even_be_opened_is_reported_not_raised(tmp_path, fresh_reports):
    (tmp_path / "file").write_text("")
    broken = log_files.LogFile(tmp_path / "file" / "below.log", "the instance log")  # a file where a folder must be
    broken.write("dropped\n")
    broken.flush()
    broken.stop()
    assert broken.failed is not None and len(fresh_reports) == 1


GUARDED = """
import sys
from loguru import logger
from data_juicer_elastic.console import log_files
logger.remove()
logger.add(sys.stderr, level="INFO", format="{message}")
logger.add("/dev/full", level="INFO", enqueue=True, compression="gz")  # as Data-Juicer's setup_logger adds its files
if sys.argv[1] == "guarded":
    log_files.guard_file_sinks()
for i in range(20):
    logger.info(f"record {i}")
log_files.close_log_sinks()
print("error: the one line", file=sys.stderr)
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_data_juicer_file_sinks_fail_once_and_before_the_error_line(guarded):
    proc = subprocess.run(
        [sys.executable, "-c", GUARDED, "guarded" if guarded else "plain"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    if not guarded:  # what a full export folder did to every record
        assert proc.stderr.count("Logging error in Loguru Handler") >= 20
        return
    assert "Logging error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    reported = [line for line in lines if "Data-Juicer's log file /dev/full cannot be written" in line]
    assert len(reported) == 1 and lines[-1] == "error: the one line", proc.stderr[-3000:]
