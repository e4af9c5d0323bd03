"""Operators used only by end-to-end tests, loaded through `custom_operator_paths`."""

import time

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("e2e_sleep_mapper")
class E2ESleepMapper(Mapper):
    """Sleep per row, so a test can kill a worker while it is inside a shard."""

    def __init__(self, seconds_per_row: float = 0.0, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds_per_row = seconds_per_row

    def process_single(self, sample):
        time.sleep(self.seconds_per_row)
        return sample


@OPERATORS.register_module("e2e_fail_mapper")
class E2EFailMapper(Mapper):
    """Raise on the row whose `id` equals `fail_id`: that shard can never succeed."""

    def __init__(self, fail_id: int = -1, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_id = fail_id

    def process_single(self, sample):
        if sample.get("id") == self.fail_id:
            raise RuntimeError(f"e2e_fail_mapper: refusing row id {self.fail_id}")
        return sample
