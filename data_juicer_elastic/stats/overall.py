"""Finalize's overall statistics: the per-shard summaries merged in shard order, never the merged file; a summary
that cannot be trusted is recomputed from its shard's output.  The files and the record: docs/analysis.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.errors import IntegrityError, JobDirError
from data_juicer_elastic.jobdir.exports import export_side_path
from data_juicer_elastic.jobdir.layout import JobLayout, ensure_dir
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import ShardResult
from data_juicer_elastic.rows.row_policy import parse_row
from data_juicer_elastic.shards.merge import accepted_results
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.stats.columns import ALPHA, ColumnKind, ColumnSummary
from data_juicer_elastic.stats.shard_summary import StatsSummary, merge_summaries

FORMAT: Final = "dj-elastic/overall-stats"
VERSION: Final = 1
DEFAULT_PERCENTILES: Final = (0.25, 0.5, 0.75)  # Data-Juicer's OverallAnalysis always adds these
ERROR_BOUND: Final = (
    "count, mean, std (sample, ddof=1), min and max are exact (floating-point rounding only); each quantile q is "
    "pandas' linear interpolation between the sorted values at ranks floor(h) and ceil(h), h = q*(count-1), "
    "with each of the two values within relative_accuracy of the exact one"
)


@dataclass(frozen=True)
class OverallStats:
    body: dict[str, Any]  # the JSON record
    csv: str  # the overall.csv table

    def write(self, json_path: Path, csv_path: Path) -> list[Path]:
        fsio.makedirs(json_path.parent)
        data = json.dumps(self.body, indent=1, ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"
        fsio.atomic_write(json_path, data)
        fsio.atomic_write(csv_path, self.csv.encode("utf-8"))
        return [json_path, csv_path]


def compute_overall(job_dir: str | Path) -> OverallStats:
    """Merge every accepted shard's summary in manifest order (JobDirError if the job is incomplete)."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    recomputed: list[str] = []

    def summaries() -> Iterator[StatsSummary]:
        for entry, result in accepted_results(layout, manifest):
            summary = _load_summary(layout, result)
            if summary is None:
                recomputed.append(entry.shard_id)
                summary = _summarise_output(layout, result)
            yield summary

    merged = merge_summaries(summaries())
    percentiles = analysis_percentiles(manifest.recipe.get("percentiles"))
    body = overall_record(merged, percentiles, shards=manifest.num_shards, recomputed=recomputed)
    if recomputed:
        logger.info(f"stats summaries recomputed from the output of {len(recomputed)} shard(s)")
    return OverallStats(body, overall_csv(merged, percentiles))


def write_overall_stats(stats: OverallStats, job_dir: str | Path, export_path: str | Path | None = None) -> list[Path]:
    """Write into the job directory and, when given, beside the export path; the files written."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    ensure_dir(layout, layout.stats_dir)  # never through a link planted in the job dir
    written = stats.write(layout.stats_dir / "overall.json", layout.stats_dir / "overall.csv")
    if export_path is not None:
        export = Path(os.path.abspath(export_path))
        written += stats.write(*(export_side_path(export, f"_overall_stats.{kind}") for kind in ("json", "csv")))
    logger.info(f"overall statistics written to {', '.join(str(p) for p in written)}")
    return written


def _load_summary(layout: JobLayout, result: ShardResult) -> StatsSummary | None:
    """The accepted output's summary, or None (logged) when it cannot be trusted."""
    if result.stats is None:
        return None
    where = f"shard {result.shard_id}"
    try:
        path = layout.resolve_relative(result.stats)
        data = fsio.read_record(path)
        if data is None:
            raise JobDirError("stats summary is missing", where=str(path))
        if hashlib.sha256(data).hexdigest() != result.stats_sha256:
            raise JobDirError("stats summary changed after publication", where=str(path))
        summary = StatsSummary.parse(data, path)
        if (summary.rows, summary.output_sha256) != (result.rows, result.sha256):
            raise JobDirError("stats summary describes other rows than the accepted output", where=str(path))
    except (JobDirError, OSError) as exc:
        logger.warning(f"{where}: recomputing stats from the output: {exc}")
        return None
    return summary


def _summarise_output(layout: JobLayout, result: ShardResult) -> StatsSummary:
    # The rows' stats are in the row stats file when the recipe makes any (jobdir.exports),
    # else in the rows themselves (keep_stats_in_res_ds) or nowhere (every row still counts).
    path = layout.resolve_relative(result.row_stats.path if result.row_stats is not None else result.output)
    try:
        with open(path, encoding="utf-8") as handle:
            summary = StatsSummary.of_rows(parse_row(line) for line in handle if line.strip())
    except (OSError, ValueError) as exc:
        raise IntegrityError(
            f"cannot read the accepted output to recompute its stats: {exc}",
            where=f"shard {result.shard_id}",
            hint=f"{path} was changed or removed after publication; prepare a new job to recompute it",
        ) from None
    if summary.rows != result.rows:
        raise IntegrityError(
            f"accepted output has {summary.rows} rows, its result says {result.rows}", where=f"shard {result.shard_id}"
        )
    return summary


def analysis_percentiles(extra: Any) -> list[float]:
    """Data-Juicer's: the recipe's ``percentiles`` plus 0.25/0.5/0.75, sorted, without repeats."""
    values = list(DEFAULT_PERCENTILES)
    if isinstance(extra, list | tuple):
        values += [float(p) for p in extra if isinstance(p, int | float) and not isinstance(p, bool) and 0 <= p <= 1]
    return sorted(set(values))


def percentile_label(q: float) -> str:
    """pandas' describe label: 0.25 -> '25%', 0.125 -> '12.5%'."""
    text = f"{q * 100:.10f}".rstrip("0").rstrip(".")
    return f"{text}%"


def column_facts(column: ColumnSummary, percentiles: Sequence[float]) -> dict[str, Any]:
    """describe()'s numbers for one column, as a dict in describe's order."""
    if column.kind is ColumnKind.NUMERIC:
        m = column.moments
        facts: dict[str, Any] = {"count": m.count, "mean": m.mean, "std": m.std, "min": m.min}
        for q in percentiles:
            # the exact quantile lies within [min, max]: clamping only moves the estimate closer
            value = column.sketch.quantile(q)
            facts[percentile_label(q)] = None if value is None else min(max(value, m.min), m.max)
        facts["max"] = m.max
        return facts
    facts = {"count": column.categorical_count, "unique": None, "top": None, "freq": None}
    if column.values:  # top: ties go to the first seen (pandas leaves ties unordered)
        top, freq = max(column.values.items(), key=lambda item: item[1])
        facts.update(unique=len(column.values), top=top, freq=freq)
    return facts


def overall_record(
    merged: StatsSummary, percentiles: Sequence[float], *, shards: int, recomputed: list[str]
) -> dict[str, Any]:
    columns, skipped = [], []
    for column in merged.columns:
        if column.kind is ColumnKind.SKIPPED:
            skipped.append({"source": column.source, "name": column.name, "reason": column.reason})
        elif column.count:
            facts = column_facts(column, percentiles)
            columns.append({"source": column.source, "name": column.name, "kind": str(column.kind), **facts})
    return {
        "format": FORMAT,
        "version": VERSION,
        "rows": merged.rows,
        "shards": shards,
        "summaries_recomputed": recomputed,
        "percentiles": list(percentiles),
        "quantile_relative_accuracy": merged.alpha if merged.columns else ALPHA,
        "error_bound": ERROR_BOUND,
        "columns": columns,
        "skipped_columns": skipped,
    }


def overall_csv(merged: StatsSummary, percentiles: Sequence[float]) -> str:
    """The table dj-analyze writes, built the way OverallAnalysis builds it (a describe() Series per column,
    ``DataFrame(...).T``), so labels, row order and number formatting are pandas' own."""
    import pandas as pd

    series = []
    for column in merged.columns:
        if column.kind is ColumnKind.SKIPPED or not column.count:
            continue
        facts = column_facts(column, percentiles)
        if column.kind is ColumnKind.NUMERIC:
            values = [math.nan if v is None else float(v) for v in facts.values()]
            series.append(pd.Series(values, index=list(facts), name=column.name, dtype="float64"))
        else:
            series.append(pd.Series(list(facts.values()), index=list(facts), name=column.name, dtype="object"))
    if not series:
        return ""
    return pd.DataFrame(series).T.to_csv()
