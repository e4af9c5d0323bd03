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


@OPERATORS.register_module("e2e_flaky_mapper")
class E2EFlakyMapper(Mapper):
    """Raise on the row whose `id` equals `fail_id` the first time only (a marker file in
    `marker_dir` remembers it across attempts and processes): that shard is retried and succeeds."""

    def __init__(self, fail_id: int = -1, marker_dir: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_id = fail_id
        self.marker_dir = marker_dir

    def process_single(self, sample):
        if sample.get("id") == self.fail_id:
            import os

            try:
                os.close(os.open(os.path.join(self.marker_dir, f"flaky-{self.fail_id}"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return sample
            raise RuntimeError(f"e2e_flaky_mapper: first attempt at row id {self.fail_id} fails")
        return sample


@OPERATORS.register_module("e2e_slow_ids_mapper")
class E2ESlowIdsMapper(Mapper):
    """Sleep on rows with `first_id <= id < end_id` only, so one shard runs long while the others are quick."""

    def __init__(self, seconds_per_row: float = 0.0, first_id: int = 0, end_id: int = 0, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds_per_row, self.first_id, self.end_id = seconds_per_row, first_id, end_id

    def process_single(self, sample):
        if self.first_id <= sample.get("id", -1) < self.end_id:
            time.sleep(self.seconds_per_row)
        return sample
