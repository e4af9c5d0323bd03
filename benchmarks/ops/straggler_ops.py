"""A benchmark operator: sleeps per row, longer on the nodes named in `slowdown` (stragglers)."""

import os
import time

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("straggler_sleep_mapper")
class StragglerSleepMapper(Mapper):
    """Sleep `seconds_per_row` x slowdown[DJ_ELASTIC_NODE_ID] per row (the node is read where the row is
    processed: Ray workers inherit the environment of the worker process that started the runtime)."""

    def __init__(self, seconds_per_row: float = 0.0, slowdown: dict | None = None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds_per_row = seconds_per_row
        self.slowdown = dict(slowdown or {})

    def process_single(self, sample):
        factor = float(self.slowdown.get(os.environ.get("DJ_ELASTIC_NODE_ID", ""), 1.0))
        time.sleep(self.seconds_per_row * factor)
        return sample
