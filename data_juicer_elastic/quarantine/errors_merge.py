"""Finalize's part of quarantine: ``<export>_errors.jsonl`` from the accepted shards' quarantine files,
staged by ``shards.merge.publish_merged`` with the rules of the per-row stats file (docs/quarantine.md).
"""

from __future__ import annotations

import functools
from pathlib import Path

from loguru import logger

from data_juicer_elastic.jobdir import own_export
from data_juicer_elastic.jobdir.attempts import requeue_hint
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import ShardEntry
from data_juicer_elastic.jobdir.result_records import ShardResult
from data_juicer_elastic.jobdir.row_errors import check_row_errors_file, export_errors_path
from data_juicer_elastic.shards.merge import StagedFile, stage_concat
from data_juicer_elastic.sharedfs import fsio


def stage_errors(
    layout: JobLayout, results: list[tuple[ShardEntry, ShardResult]], output: Path, tag: str
) -> StagedFile | None:
    """The merged quarantine file under a temp name (the merge's own writer and temp names); None
    when no row was quarantined (an earlier merge's file is then removed: ``remove_stale_errors``)."""
    if sum(result.errors.rows for _, result in results if result.errors is not None) == 0:
        return None
    size = sum(result.errors.bytes for _, result in results if result.errors is not None)
    copies = (
        functools.partial(check_row_errors_file, layout, entry, result, requeue_hint(layout, [entry.shard_id]))
        for entry, result in results
        if result.errors is not None
    )
    return stage_concat(export_errors_path(output), tag, size, copies)


def remove_stale_errors(layout: JobLayout, output: Path, overwrite: bool) -> None:
    """After a merge that quarantined no row: an earlier merge's ``<export>_errors.jsonl`` (before
    ``retry --quarantined``) is removed with ``overwrite`` or when this job wrote it, else named."""
    path = export_errors_path(output)
    if fsio.exists(path) and (overwrite or own_export.written_by_job(layout, path)):
        fsio.remove(path)
    elif fsio.exists(path):
        logger.warning(f"{path} is from an earlier merge: no row is quarantined now (overwrite removes it)")
