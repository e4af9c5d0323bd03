"""The shard runner's hook: summarise the rows of an attempt's output while it is written.  Advisory: a failure
here is logged and leaves the summary out (finalize then recomputes it from the accepted output); it never fails
the shard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loguru import logger

from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.stats.columns import StatsCollector
from data_juicer_elastic.stats.shard_summary import FILE_NAME, StatsSummary


class ShardStatsRecorder:
    def __init__(self, shard_id: str, attempt_id: str, attempt_dir: Path):
        self.shard_id, self.attempt_id = shard_id, attempt_id
        self.path = Path(attempt_dir) / FILE_NAME
        self._collector: StatsCollector | None = StatsCollector()

    def observe(self, row: dict[str, Any]) -> None:
        if self._collector is None:
            return
        try:
            self._collector.add_row(row)
        except Exception as exc:  # a bug here must not cost the shard its output
            logger.opt(exception=exc).warning(f"shard {self.shard_id}: stats summary abandoned")
            self._collector = None

    def write(self, rows: int, output_sha256: str) -> Path | None:
        """Write ``stats.json`` for the finished output; its path, or None when there is none."""
        collector = self._collector
        if collector is None:
            return None
        if collector.rows != rows:  # the writer and the recorder saw different rows: do not trust it
            logger.warning(f"shard {self.shard_id}: stats saw {collector.rows} rows, output has {rows}; left out")
            return None
        try:
            summary = StatsSummary.from_collector(
                collector, shard_id=self.shard_id, attempt_id=self.attempt_id, output_sha256=output_sha256
            )
            fsio.atomic_write(self.path, summary.encode())
        except Exception as exc:
            logger.opt(exception=exc).warning(f"shard {self.shard_id}: could not write the stats summary")
            return None
        return self.path
