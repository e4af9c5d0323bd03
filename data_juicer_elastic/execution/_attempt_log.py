"""Route one attempt's driver-side logs (loguru, Ray Data's ``ray.data``) into ``attempt_dir/process.log``:
a sink per attempt.  Output printed inside Ray worker processes is not captured (Ray forwards it, in
batches that can arrive after the attempt ended, and keeps it in ``logs/worker-*.err``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from loguru import logger

from data_juicer_elastic.console.log_files import LogFile

_FORMAT: Final = "{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <8} | {name}:{line} - {message}"


@contextlib.contextmanager
def attempt_log(path: Path, level: str = "INFO") -> Iterator[None]:
    # One line-buffered stream shared by both writers keeps their lines whole and in order;
    # append mode keeps what an earlier step of this attempt wrote.  A full disk costs its
    # lines, never the attempt (``console.log_files``): the output write reports it.
    stream = LogFile(path, "the attempt log")
    sink_id = logger.add(
        stream,
        level=level,
        format=_FORMAT,
        colorize=False,
        enqueue=False,  # synchronous: every line is on disk before the sink is removed
        backtrace=False,
        diagnose=False,  # no variable values (possibly row contents) in tracebacks
    )
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)-8s | %(name)s - %(message)s"))
    ray_data = logging.getLogger("ray.data")
    ray_data.addHandler(handler)
    try:
        yield
    finally:
        ray_data.removeHandler(handler)
        with contextlib.suppress(ValueError):  # someone called logger.remove() for all sinks
            logger.remove(sink_id)
        stream.stop()
