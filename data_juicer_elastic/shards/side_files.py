"""The side files of a shard's rows, for both export layouts: the per-row stats (``<export>_stats.jsonl``,
``jobdir.exports``) and the rows operators failed on (``<export>_errors.jsonl``; docs/quarantine.md).  What an
attempt directory and an accepted result hold of them, and how each layout publishes them: ``file`` concatenates
each kind beside the export, each staged complete and fsynced under a temp name, every target checked before any
is published, all published or none; ``parts`` links each shard's beside its part (``shards.parts``), its index
naming and hashing them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.dedup.hash_quarantine import hash_failure_lines
from data_juicer_elastic.errors import IntegrityError, OutputExistsError, preview
from data_juicer_elastic.jobdir import attempts, exports
from data_juicer_elastic.jobdir.exports import (
    ERRORS_FILE,
    ROW_STATS_FILE,
    ExportPart,
    MergedSideFile,
    MergeRecord,
    check_row_errors_file,
    export_errors_path,
    export_stats_path,
    part_errors_name,
    part_stats_name,
)
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import ShardEntry, ShardResult
from data_juicer_elastic.shards.merge_files import AppendStream, merge_temp_path, remove_dead_merge_temps
from data_juicer_elastic.sharedfs import fault_seam, fsio

Sink = Callable[[bytes], None]
Results = list[tuple[ShardEntry, ShardResult]]
Expected = tuple[int, int, str]  # rows, bytes, sha256

ATTEMPT_FILES: Final = (ROW_STATS_FILE, ERRORS_FILE)  # in an attempt's directory, beside its output


def result_files(result: ShardResult) -> list[tuple[str, str, Expected]]:
    """``(what, path as its done marker names it, (rows, bytes, sha256))`` of each side file of an accepted
    result: its row stats file (one line per output row), then its quarantine file."""
    files = []
    if (stats := result.row_stats) is not None:
        files.append(("row stats file", stats.path, (result.rows, stats.bytes, stats.sha256)))
    if (errors := result.errors) is not None:
        files.append(("quarantine file", errors.path, (errors.rows, errors.bytes, errors.sha256)))
    return files


def part_fields(shard_id: str, result: ShardResult) -> dict[str, Any]:
    """The fields of a shard's ``ExportPart`` that name its side files, each linked beside its part."""
    fields: dict[str, Any] = {}
    if (stats := result.row_stats) is not None:
        fields.update(stats_name=part_stats_name(shard_id), stats_bytes=stats.bytes, stats_sha256=stats.sha256)
    if (errors := result.errors) is not None:
        fields.update(
            errors_name=part_errors_name(shard_id),
            errors_rows=errors.rows,
            errors_bytes=errors.bytes,
            errors_sha256=errors.sha256,
        )
    return fields


def beside_part(part: ExportPart) -> list[tuple[str, Expected]]:
    """``(name, (rows, bytes, sha256))`` of each side file beside ``part`` in a parts export."""
    files = []
    if part.stats_name is not None:
        files.append((part.stats_name, (part.rows, part.stats_bytes, part.stats_sha256)))
    if part.errors_name is not None:
        files.append((part.errors_name, (part.errors_rows, part.errors_bytes, part.errors_sha256)))
    return files


def parts_quarantined(target: Path, parts: list[ExportPart], sha: str, written: bool) -> MergedSideFile | None:
    """A parts export's quarantine files as merge.json records them (the export and its index's sha256: the index
    names and hashes each); None when no row was quarantined."""
    if not any(part.errors_name for part in parts):
        return None
    rows, size = (sum(getattr(part, name) or 0 for part in parts) for name in ("errors_rows", "errors_bytes"))
    return MergedSideFile(target, rows, size, sha, written)


def beside_export(record: MergeRecord) -> list[tuple[str, str, str | None]]:
    """``(what, path, sha256)`` of each side file a one-file export's merge published beside it."""
    files = [
        ("row stats file", record.row_stats_path, record.row_stats_sha256),
        ("quarantine file", record.errors_path, record.errors_sha256),
    ]
    return [(what, path, sha) for what, path, sha in files if path]


@dataclass(frozen=True)
class StagedFile:
    tmp: Path  # complete and fsynced, under a temp name beside the target
    record: MergedSideFile  # what it will be once published (``written`` decided then)

    def publish(self, overwrite: bool) -> MergedSideFile:
        return dataclasses.replace(self.record, written=publish_output(self.tmp, self.record.path, overwrite))


def publish_merged(
    layout: JobLayout, results: Results, tmp: Path, output: Path, stats: StagedFile | None, overwrite: bool, tag: str
) -> tuple[bool, MergedSideFile | None, MergedSideFile | None]:
    """Publish the merged output (complete and fsynced at ``tmp``) and its side files, the row stats (``stats``)
    and the quarantine file (staged here), or none: every target is checked before any is published.
    (written, row stats, quarantine file).  The quarantine file's temp is removed afterwards, whatever happened;
    ``tmp`` and ``stats`` stay their caller's."""
    errors = None
    try:
        errors = stage_errors(layout, results, output, tag)
        fault_seam.fault_point("finalize", output)  # named crash point: merged, not yet published
        staged = [(tmp, output), *((s.tmp, s.record.path) for s in (stats, errors) if s is not None)]
        replace = overwrite or may_replace(layout, staged)
        for new, target in staged:
            refuse_if_different(new, target, replace)
        written = publish_output(tmp, output, replace)
        sides = tuple(None if side is None else side.publish(replace) for side in (stats, errors))
        if errors is None:  # no row quarantined now: an earlier merge's file goes too
            remove_stale_errors(layout, output, overwrite)
        return written, *sides
    finally:
        if errors is not None:
            fsio.remove(errors.tmp)


def may_replace(layout: JobLayout, staged: list[tuple[Path, Path]]) -> bool:
    """Whether every export file the merge would change is one this job itself wrote (merge.json's hash proves it):
    after ``dj-elastic retry`` the job's result differs from its export, which the merge then replaces without
    ``overwrite``; a file edited since, or anyone else's, still needs it.  Reads merge.json only when one differs."""
    changed = [target for new, target in staged if fsio.exists(target) and not fsio.same_bytes(new, target)]
    if not changed:
        return False
    recorded = exports.recorded_files(layout)
    return all(exports.written_by_job(layout, target, recorded) for target in changed)


def stage_row_stats(layout: JobLayout, results: Results, output: Path, tag: str) -> StagedFile | None:
    """``<export>_stats.jsonl`` from the accepted row stats files in manifest order (validated as they are
    copied), under a temp name; None when the recipe makes no per-row stats."""
    if all(result.row_stats is None for _, result in results):
        return None
    missing = [entry.shard_id for entry, result in results if result.row_stats is None and result.rows]
    if missing:
        raise IntegrityError(
            f"{len(missing)} shard(s) have output rows but no row stats file ({preview(missing, 8)})",
            where=str(layout.root),
            hint="the shards were run by different versions or recipes; prepare a new job_dir",
        )
    total = sum(result.row_stats.bytes for _, result in results if result.row_stats is not None)
    copies = (functools.partial(attempts.check_row_stats_file, layout, entry, result) for entry, result in results)
    return stage_concat(export_stats_path(output), tag, total, copies)


def streamed_row_stats(stream: AppendStream | None, results: Results, output: Path) -> StagedFile | None:
    """The streaming merge's row stats (``stream``) as the file to publish, when it holds exactly the accepted row
    stats files (each validated as it was appended); None: write them whole instead (or refuse:
    :func:`stage_row_stats`)."""
    with_stats = [r.row_stats for _, r in results if r.row_stats is not None]
    missing = [r for _, r in results if r.row_stats is None and r.rows]
    if stream is None or not with_stats or missing or stream.bytes != sum(s.bytes for s in with_stats):
        return None
    rows = sum(r.rows for _, r in results if r.row_stats is not None)
    record = MergedSideFile(export_stats_path(output), rows, stream.bytes, stream.sha, written=False)
    return StagedFile(stream.path, record)


def stage_errors(layout: JobLayout, results: Results, output: Path, tag: str) -> StagedFile | None:
    """``<export>_errors.jsonl`` from the accepted shards' quarantine files in manifest order, each checked as it
    is copied, with the rows whose hashing raised in a deduplication stage's signature run put among their
    shard's lines in input order (``dedup.hash_quarantine``), under a temp name; None when no row was
    quarantined (an earlier merge's file is then removed: :func:`remove_stale_errors`)."""
    failures = hash_failure_lines(layout, load_manifest(layout.root)) if _deduplicates(layout) else {}
    with_errors = [(entry, result) for entry, result in results if result.errors is not None]
    if sum(result.errors.rows for _, result in with_errors) + sum(map(len, failures.values())) == 0:
        return None
    size = sum(result.errors.bytes for _, result in with_errors)
    size += sum(len(line) for lines in failures.values() for _, line in lines)
    copies = (
        functools.partial(
            _shard_errors,
            layout,
            entry,
            result,
            attempts.requeue_hint(layout, [entry.shard_id]),
            failures.get(entry.shard_id, []),
        )  # fmt: skip
        for entry, result in results
        if result.errors is not None or entry.shard_id in failures
    )
    return stage_concat(export_errors_path(output), tag, size, copies)


def _deduplicates(layout: JobLayout) -> bool:
    return fsio.exists(layout.dedup_dir)


def _shard_errors(layout: JobLayout, entry, result, requeue: str, failed: list[tuple[int, bytes]], sink: Sink) -> int:
    """One shard's quarantine lines: its accepted result's file (checked as copied) and ``failed`` (input
    row, line: sorted), merged by the row within the shard (``shard_row``), each line as it was written."""
    if not failed:
        return check_row_errors_file(layout, entry, result, requeue, sink)
    pending, partial = list(failed), [b""]

    def merge(data: bytes) -> None:
        lines = (partial[0] + data).split(b"\n")
        partial[0] = lines.pop()
        for line in lines:
            row = json.loads(line).get("shard_row", -1)
            while pending and pending[0][0] < row:
                sink(pending.pop(0)[1])
            sink(line + b"\n")

    rows = check_row_errors_file(layout, entry, result, requeue, merge) if result.errors is not None else 0
    if partial[0]:
        raise IntegrityError("a quarantine file does not end with a newline", where=str(layout.root))
    for _, line in pending:
        sink(line)
    return rows + len(failed)


def remove_stale_errors(layout: JobLayout, output: Path, overwrite: bool) -> None:
    """After a merge that quarantined no row: an earlier merge's ``<export>_errors.jsonl`` (before
    ``retry --quarantined``) is removed with ``overwrite`` or when this job wrote it, else named."""
    path = export_errors_path(output)
    if fsio.exists(path) and (overwrite or exports.written_by_job(layout, path)):
        fsio.remove(path)
    elif fsio.exists(path):
        logger.warning(f"{path} is from an earlier merge: no row is quarantined now (overwrite removes it)")


def stage_concat(path: Path, tag: str, size_hint: int, copies: Iterable[Callable[[Sink], int]]) -> StagedFile:
    """``path``'s file under a temp name beside it, complete and fsynced: each of ``copies`` appends its part to
    the sink it is given, validated as it is copied, and returns its rows (in merge order)."""
    remove_dead_merge_temps(path, tag)
    out = AppendStream.create(merge_temp_path(path, tag), size_hint)
    rows = 0
    try:
        for copy in copies:
            rows += copy(out.append)
        out.finish()
    except BaseException:
        out.abort()
        raise
    return StagedFile(out.path, MergedSideFile(path, rows, out.bytes, out.sha, written=False))


def refuse_if_different(tmp: Path, output: Path, overwrite: bool) -> None:
    """OutputExistsError when a different file is at ``output`` and overwriting is off."""
    if not overwrite and fsio.exists(output) and not fsio.same_bytes(tmp, output):
        raise OutputExistsError(
            "a different file already exists at the export path",
            where=str(output),
            hint="set overwrite (elastic.overwrite_output / --overwrite) or choose another path",
        )


def publish_output(tmp: Path, output: Path, overwrite: bool) -> bool:
    """True when we wrote ``output``; False when an identical file was already there."""
    if os.path.islink(output):  # never followed (export_path): the link is what is there
        if not overwrite:
            raise OutputExistsError(
                f"a symlink is at the export path (to {os.readlink(output)}); the merge never writes through it",
                where=str(output),
                hint="remove the link, or set overwrite to replace the link itself (its target is left alone)",
            )
    elif fsio.exists(output):
        if fsio.same_bytes(tmp, output):
            return False
        refuse_if_different(tmp, output, overwrite)  # it is different: refused unless overwrite
    elif fsio.publish_exclusive(tmp, output):  # link(): two concurrent mergers cannot both think they created it
        return True
    elif not overwrite:
        raise OutputExistsError(
            "a different file appeared at the export path while merging", where=str(output), hint="choose another path"
        )
    fsio.replace(tmp, output)
    return True
