"""Operators for tests/execution, loaded through a recipe's ``custom_operator_paths``.

Kept as a top-level package (not imported as ``tests.execution...``) so Ray
workers import it from the runtime's ``py_modules`` by the same name.
"""

import time

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("dj_elastic_test_slow_head_mapper")
class SlowHeadMapper(Mapper):
    """Sleeps on any batch holding a row whose ``idx`` is below ``slow_below``.

    With the shard split into several blocks, the first block then finishes
    last: without ``preserve_order`` Ray writes it as the last part.
    """

    _batched_op = True

    def __init__(self, slow_below: int = 10, delay: float = 1.0, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slow_below = slow_below
        self.delay = delay

    def process_batched(self, samples):
        if any(i < self.slow_below for i in samples["idx"]):
            time.sleep(self.delay)
        return samples


@OPERATORS.register_module("dj_elastic_test_boom_mapper")
class BoomMapper(Mapper):
    """Raises on every row."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

    def process_single(self, sample):
        raise ValueError("boom: the test operator failed on purpose")
