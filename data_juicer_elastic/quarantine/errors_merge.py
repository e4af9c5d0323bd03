"""Finalize's part of quarantine: which of the accepted shards' quarantine files make
``<export>_errors.jsonl`` and how each is checked as it is copied; ``shards.merge.publish_merged`` stages
and publishes it with the rules of the per-row stats file (docs/quarantine.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from data_juicer_elastic.jobdir.attempts import requeue_hint
from data_juicer_elastic.jobdir.exports import written_by_job
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import ShardEntry, ShardResult
from data_juicer_elastic.jobdir.row_files import check_row_errors_file, export_errors_path
from data_juicer_elastic.sharedfs import fsio


def errors_parts(
    layout: JobLayout, results: list[tuple[ShardEntry, ShardResult]]
) -> tuple[int, list[Callable[[Callable[[bytes], None]], int]]] | None:
    """(bytes, one copy per shard with a quarantine file) for the merged quarantine file: each copy
    appends its shard's file to the sink it is given, checked as it is copied, and returns its rows.
    None when no row was quarantined (an earlier merge's file is then removed: ``remove_stale_errors``)."""
    if sum(result.errors.rows for _, result in results if result.errors is not None) == 0:
        return None
    size = sum(result.errors.bytes for _, result in results if result.errors is not None)
    copies = [
        functools.partial(check_row_errors_file, layout, entry, result, requeue_hint(layout, [entry.shard_id]))
        for entry, result in results
        if result.errors is not None
    ]
    return size, copies


def remove_stale_errors(layout: JobLayout, output: Path, overwrite: bool) -> None:
    """After a merge that quarantined no row: an earlier merge's ``<export>_errors.jsonl`` (before
    ``retry --quarantined``) is removed with ``overwrite`` or when this job wrote it, else named."""
    path = export_errors_path(output)
    if fsio.exists(path) and (overwrite or written_by_job(layout, path)):
        fsio.remove(path)
    elif fsio.exists(path):
        logger.warning(f"{path} is from an earlier merge: no row is quarantined now (overwrite removes it)")
