"""The per-shard stats summary record, ``attempts/<shard>/<attempt>/stats.json`` (encode/parse), and the merge of
summaries.  It names the output's sha256 and row count: finalize uses it only for the accepted output it belongs
to (docs/analysis.md, "Where the numbers come from").  Each column holds ``moments`` + ``sketch`` (numeric),
``count`` + ``values`` ([[value, count], ...] in first-seen order, null past MAX_DISTINCT), or ``reason`` (skipped).

The shard runner's hook (:class:`ShardStatsRecorder`) summarises the rows of an attempt's output while it is
written.  Advisory: a failure there is logged and leaves the summary out (finalize then recomputes it from the
accepted output); it never fails the shard.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.stats.columns import (
    ALPHA,
    ColumnKind,
    ColumnSummary,
    Moments,
    QuantileSketch,
    Shape,
    StatsCollector,
)

FORMAT: Final = "dj-elastic/stats-summary"
VERSION: Final = 1
FILE_NAME: Final = "stats.json"  # inside the attempt directory, beside output.jsonl


@dataclass
class StatsSummary:
    rows: int
    columns: list[ColumnSummary]
    alpha: float = ALPHA
    shard_id: str = ""
    attempt_id: str = ""
    output_sha256: str = ""

    @classmethod
    def from_collector(
        cls, collector: StatsCollector, *, shard_id: str = "", attempt_id: str = "", output_sha256: str = ""
    ) -> StatsSummary:
        return cls(collector.rows, collector.columns(), ALPHA, shard_id, attempt_id, output_sha256)

    @classmethod
    def of_rows(cls, rows: Iterable[dict[str, Any]]) -> StatsSummary:
        collector = StatsCollector()
        for row in rows:
            collector.add_row(row)
        return cls.from_collector(collector)

    def encode(self) -> bytes:
        body = {
            "format": FORMAT,
            "version": VERSION,
            "shard_id": self.shard_id,
            "attempt_id": self.attempt_id,
            "rows": self.rows,
            "output_sha256": self.output_sha256,
            "alpha": self.alpha,
            "columns": [_encode_column(c) for c in self.columns],
        }
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"

    @classmethod
    def parse(cls, data: bytes, where: str | Path) -> StatsSummary:
        """The summary, or JobDirError naming ``where``; never a half-valid summary."""
        try:
            obj = json.loads(data)
            if not isinstance(obj, dict) or obj.get("format") != FORMAT:
                raise ValueError(f"not a {FORMAT} record")
            if obj.get("version") != VERSION:
                raise ValueError(f"version {obj.get('version')!r}; this dj-elastic reads version {VERSION}")
            rows, alpha = obj["rows"], obj["alpha"]
            if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
                raise ValueError(f"bad rows {rows!r}")
            if not isinstance(alpha, float):
                raise ValueError(f"bad alpha {alpha!r}")
            texts = [obj[k] for k in ("shard_id", "attempt_id", "output_sha256")]
            if not all(isinstance(t, str) for t in texts):
                raise ValueError("shard_id, attempt_id and output_sha256 must be strings")
            columns = [_parse_column(c, alpha) for c in obj["columns"]]
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
            raise JobDirError(f"corrupt stats summary: {exc}", where=str(where)) from None
        return cls(rows, columns, alpha, *texts)


def merge_summaries(summaries: Iterable[StatsSummary]) -> StatsSummary:
    """Fold summaries in the given (shard) order: columns keep their first-seen order."""
    rows = 0
    merged: dict[tuple[str, str], ColumnSummary] = {}
    for summary in summaries:
        if summary.alpha != ALPHA:
            raise ValueError(f"summary accuracy {summary.alpha} differs from {ALPHA}")
        rows += summary.rows
        for column in summary.columns:
            if column.key not in merged:
                merged[column.key] = ColumnSummary(column.source, column.name)
            merged[column.key].merge(column)
    columns = sorted(merged.values(), key=lambda c: c.source != "stats")
    return StatsSummary(rows, columns, ALPHA)


def _encode_column(column: ColumnSummary) -> dict[str, Any]:
    body: dict[str, Any] = {
        "source": column.source,
        "name": column.name,
        "kind": str(column.kind),
        "shape": str(column.shape),
    }
    if column.kind is ColumnKind.NUMERIC:
        body["moments"] = column.moments.to_dict()
        body["sketch"] = column.sketch.to_dict()
    elif column.kind.counts_values:
        body["count"] = column.categorical_count
        body["values"] = None if column.values is None else [[v, c] for v, c in column.values.items()]
    elif column.kind is ColumnKind.SKIPPED:
        body["reason"] = column.reason
    return body


def _parse_column(obj: Any, alpha: float) -> ColumnSummary:
    if not isinstance(obj, dict):
        raise ValueError("a column is not an object")
    source, name = obj["source"], obj["name"]
    if source not in ("stats", "meta") or not isinstance(name, str):
        raise ValueError(f"bad column {source!r}/{name!r}")
    column = ColumnSummary(source, name, kind=ColumnKind(obj["kind"]), shape=Shape(obj["shape"]))
    column.sketch = QuantileSketch(alpha)
    if column.kind is ColumnKind.NUMERIC:
        column.moments = Moments.from_dict(obj["moments"])
        column.sketch = QuantileSketch.from_dict(obj["sketch"])
        if column.sketch.alpha != alpha or column.sketch.count != column.moments.count:
            raise ValueError(f"column {name!r}: sketch disagrees with its moments")
    elif column.kind.counts_values:
        count, values = obj["count"], obj["values"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"column {name!r}: bad count {count!r}")
        column.categorical_count = count
        if values is None:
            column.values = None
        else:
            column.values = {}
            for value, n in values:
                expected = bool if column.kind is ColumnKind.BOOLEAN else str
                if type(value) is not expected or isinstance(n, bool) or not isinstance(n, int) or n < 1:
                    raise ValueError(f"column {name!r}: bad value count {value!r}: {n!r}")
                column.values[value] = n
            if sum(column.values.values()) != count:
                raise ValueError(f"column {name!r}: value counts do not add up to {count}")
    elif column.kind is ColumnKind.SKIPPED:
        reason = obj["reason"]
        column.reason = reason if isinstance(reason, str) else "skipped"
    return column


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
