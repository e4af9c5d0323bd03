"""A model-load stand-in for ``bench_warm_ops.py`` and the warm-operator e2e test.

Loaded through a recipe's ``custom_operator_paths``.  ``__init__`` sleeps ``load_secs``
(loading a model) and each batch sleeps ``batch_secs`` (running it); both append one JSON
line to ``record_path`` (an operator argument rather than an environment variable: it
reaches the driver, Ray tasks and Ray actors alike), so a run can count the loads per
process and place every batch on a time line.  Rows pass through unchanged.
"""

import json
import os
import time

from data_juicer.ops.base_op import OPERATORS, Mapper


def _record(path: str, **fields) -> None:
    if not path:
        return
    line = (json.dumps({**fields, "pid": os.getpid()}) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one small O_APPEND write: lines of several processes never interleave
    finally:
        os.close(fd)


@OPERATORS.register_module("bench_heavy_load_mapper")
class HeavyLoadMapper(Mapper):
    """Pass-through mapper with a slow ``__init__`` (the model load) and a fixed time per batch."""

    _batched_op = True

    def __init__(self, load_secs: float = 1.0, batch_secs: float = 0.1, record_path: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.load_secs, self.batch_secs, self.record_path = load_secs, batch_secs, record_path
        t0 = time.time()
        time.sleep(load_secs)
        _record(record_path, event="load", t0=t0, t1=time.time())

    def process_batched(self, samples):
        t0 = time.time()
        time.sleep(self.batch_secs)
        ids = samples.get("id") or [None]
        _record(self.record_path, event="batch", t0=t0, t1=time.time(), first=ids[0], rows=len(ids))
        return samples
