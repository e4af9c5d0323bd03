"""An operator for the report's end-to-end job, loaded through `custom_operator_paths`: one row that
always fails, one that fails only the first time (a retried shard), and a slow range of rows (a shard
that is still running when the first report is taken)."""

import os
import time

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("report_scenario_mapper")
class ReportScenarioMapper(Mapper):
    def __init__(
        self,
        fail_id: int = -1,
        flaky_id: int = -1,
        flaky_marker: str = "",
        slow_ids: list | None = None,
        seconds_per_row: float = 0.0,
        *args,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.fail_id, self.flaky_id, self.flaky_marker = fail_id, flaky_id, flaky_marker
        self.slow_ids = slow_ids or [0, -1]
        self.seconds_per_row = seconds_per_row

    def process_single(self, sample):
        row = sample.get("id")
        if row == self.fail_id:
            raise RuntimeError(f"report_scenario_mapper: refusing row {row}")
        if row == self.flaky_id and self.flaky_marker:
            try:  # the first attempt that gets here creates the marker and fails; later ones pass
                os.close(os.open(self.flaky_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                raise RuntimeError(f"report_scenario_mapper: row {row} fails on the first attempt only")
        if self.slow_ids[0] <= row <= self.slow_ids[1]:
            time.sleep(self.seconds_per_row)
        return sample
