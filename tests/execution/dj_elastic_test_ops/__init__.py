"""Operators for tests/execution, loaded through a recipe's ``custom_operator_paths``.

Kept as a top-level package (not imported as ``tests.execution...``) so Ray
workers import it from the runtime's ``py_modules`` by the same name.
"""

import os
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


@OPERATORS.register_module("dj_elastic_test_loads_mapper")
class LoadsMapper(Mapper):
    """Records each construction (``load <pid>``) and each batch (``batch <pid> <first idx>``) in
    ``record_path``; raises on the row whose ``idx`` is ``fail_idx`` until ``marker`` exists (it
    creates it): the first attempt at that shard fails, the next succeeds."""

    _batched_op = True

    def __init__(self, record_path: str = "", fail_idx: int = -1, marker: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.record_path, self.fail_idx, self.marker = record_path, fail_idx, marker
        self._record(f"load {os.getpid()}")

    def _record(self, line: str) -> None:
        with open(self.record_path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    def process_batched(self, samples):
        self._record(f"batch {os.getpid()} {samples['idx'][0]}")
        if self.fail_idx in samples["idx"] and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError(f"loads mapper: first attempt at idx {self.fail_idx} fails")
        return samples
