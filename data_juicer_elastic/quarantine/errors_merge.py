"""Finalize's part of quarantine: ``<export>_errors.jsonl`` from the accepted shards' quarantine files.

Imported by ``shards.merge`` and ``shards.stream_merge`` where they use it (it uses their writer).
The same rules as the per-row stats file (``shards.merge.stage_row_stats``): each accepted
result's quarantine file (:mod:`jobdir.row_errors`) is re-checked against its record as it is
copied, in manifest order, into a temp file beside the target; the target is checked (a
*different* existing file is refused unless ``overwrite``) before the merged output is published,
and the file is published right after it.  No quarantined row: no file is written, and with
``overwrite`` an earlier merge's file there is removed (the rows it listed were retried).

Per shard, :func:`copy_shard_errors` is the unit: an export written as one part per shard puts
each shard's copy beside its part; the single-file export concatenates them here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from data_juicer_elastic.jobdir.attempts import requeue_hint
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import ShardEntry
from data_juicer_elastic.jobdir.result_records import ShardResult
from data_juicer_elastic.jobdir.row_errors import MergedErrors, check_row_errors_file, export_errors_path
from data_juicer_elastic.shards.merge import (
    OutputAppender,
    merge_temp_path,
    publish_output,
    refuse_if_different,
    remove_dead_merge_temps,
)
from data_juicer_elastic.sharedfs import checked_writer, fsio


@dataclass(frozen=True)
class StagedErrors:
    tmp: Path  # complete and fsynced, beside the target
    record: MergedErrors


def quarantined_rows(results: list[tuple[ShardEntry, ShardResult]]) -> int:
    return sum(result.errors.rows for _, result in results if result.errors is not None)


def copy_shard_errors(layout: JobLayout, entry: ShardEntry, result: ShardResult, sink: Callable[[bytes], None]) -> int:
    """Copy one accepted result's quarantine file into ``sink``, re-checked as it is read; its rows."""
    return check_row_errors_file(layout, entry, result, requeue_hint(layout, [entry.shard_id]), sink)


def stage_errors(
    layout: JobLayout, results: list[tuple[ShardEntry, ShardResult]], output: Path, tag: str, *, overwrite: bool
) -> StagedErrors | None:
    """The merged quarantine file under a temp name (the merge's own writer and temp names), its target
    checked; None when no row was quarantined."""
    path = export_errors_path(output)
    if quarantined_rows(results) == 0:
        if fsio.exists(path) and overwrite:  # an earlier merge's (before retry --quarantined): replaced by none
            fsio.remove(path)
        elif fsio.exists(path):
            logger.warning(f"{path} is from an earlier merge: no row is quarantined now (overwrite removes it)")
        return None
    remove_dead_merge_temps(path, tag)
    tmp = merge_temp_path(path, tag)
    size = sum(result.errors.bytes for _, result in results if result.errors is not None)
    out = OutputAppender(checked_writer.BufferedCheckedWriter(tmp, size_hint=size), sync_path=tmp)
    rows = 0
    try:
        for entry, result in results:
            if result.errors is not None:
                rows += copy_shard_errors(layout, entry, result, out.append)
        out.finish()
    except BaseException:
        out.abort()
        raise
    try:
        refuse_if_different(tmp, path, overwrite)
    except BaseException:
        fsio.remove(tmp)
        raise
    return StagedErrors(tmp, MergedErrors(path, rows, out.bytes, out.digest.hexdigest(), written=False))


def discard_errors(staged: StagedErrors | None) -> None:
    """Remove a staged file that will not be published (the merge failed after staging it)."""
    if staged is not None:
        fsio.remove(staged.tmp)


def publish_errors(staged: StagedErrors | None, overwrite: bool) -> MergedErrors | None:
    """Publish the staged file (after the merged output): its record, None when there was none."""
    if staged is None:
        return None
    try:
        written = publish_output(staged.tmp, staged.record.path, overwrite)
    finally:
        fsio.remove(staged.tmp)
    return MergedErrors(staged.record.path, staged.record.rows, staged.record.bytes, staged.record.sha256, written)
