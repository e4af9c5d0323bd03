"""A job's result as a parts export: one part file per shard (the accepted output itself, hard-linked) in a
staging directory, the index last, renamed into place; idempotent.  The layout, the steps and the refusals:
docs/output-layouts.md.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from loguru import logger

from data_juicer_elastic.errors import IntegrityError, JobDirError, OutputExistsError, storage_errors
from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.exports import (
    PARTS_INDEX,
    ExportPart,
    MergedShard,
    PartsIndex,
    check_published_file,
    locate_published_file,
    merge_places,
    part_name,
)
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import Manifest, ShardEntry, ShardResult
from data_juicer_elastic.shards import side_files
from data_juicer_elastic.shards.merge import MergeResult, accepted_results, open_export, record_merge
from data_juicer_elastic.shards.merge_files import merge_temp_path, remove_dead_merge_temps
from data_juicer_elastic.sharedfs import fault_seam, fsio
from data_juicer_elastic.sharedfs.identity import kernel_tag

MAX_INDEX_BYTES: Final = 256 * 1024 * 1024  # ~300 bytes a part: room for every shard count a job may have
IDENTICAL: Final = "identical"


@dataclass(frozen=True)
class PartFile:
    """One accepted file of a part: where it is, its name in the export, and its record."""

    src: Path
    name: str
    what: str  # "output", "row stats file" or "quarantine file"
    relative: str  # as its done marker names it
    expected: tuple[int, int, str]  # rows, bytes, sha256


@dataclass(frozen=True)
class PlannedPart:
    """One part to publish: its index entry and the accepted files it is made of (its output first)."""

    part: ExportPart
    files: list[PartFile]
    entry: ShardEntry
    result: ShardResult


@storage_errors(then="run the merge again", places=merge_places)  # ENOSPC, EROFS...: one line naming path and place
def publish_parts(job_dir: str | Path, export_dir: str | Path, overwrite: bool = False) -> MergeResult:
    """Publish every accepted output as the parts export at ``export_dir``; merge.json records it."""
    layout, manifest, target = open_export(job_dir, export_dir, layout_name="parts")
    planned = [plan_part(layout, entry, result) for entry, result in accepted_results(layout, manifest)]
    index = parts_index(manifest, [p.part for p in planned])
    data = index.encode()
    found = compare_existing(target, data, planned)
    written = found != IDENTICAL
    if written:
        if found is not None and not overwrite:
            raise OutputExistsError(
                f"a different parts export is at the export path: {found}",
                where=str(target),
                hint="set overwrite (elastic.overwrite_output / --overwrite) to replace it, or choose another "
                "directory; `dj-elastic verify` checks an export fully",
            )
        _stage_and_publish(layout, target, data, planned, replace=found is not None)
    merged = [MergedShard(p.shard_id, p.attempt_id, p.rows, p.bytes, p.sha256) for p in (e.part for e in planned)]
    sha = hashlib.sha256(data).hexdigest()
    quarantined = side_files.parts_quarantined(target, [p.part for p in planned], sha, written)
    return record_merge(layout, manifest, target, merged, sha, written, None, quarantined, layout_name="parts")


def plan_part(layout: JobLayout, entry: ShardEntry, result: ShardResult) -> PlannedPart:
    """The part of one accepted result, after the checks that read no data: each file where its marker says,
    inside its attempt's directory, with the size its marker records."""
    part = ExportPart(
        name=part_name(entry.shard_id),
        shard_id=entry.shard_id,
        attempt_id=result.attempt_id,
        rows=result.rows,
        bytes=result.bytes,
        sha256=result.sha256,
        **side_files.part_fields(entry.shard_id, result),
    )
    sources = [("output", result.output), *((what, relative) for what, relative, _ in side_files.result_files(result))]
    requeue = attempts.requeue_hint(layout, [entry.shard_id])
    files = []
    for (what, relative), (name, expected) in zip(sources, part_files(part), strict=True):
        src = locate_published_file(layout, entry, result, what=what, relative=relative, requeue=requeue)
        _check_size(entry, src, expected[1], what, requeue)
        files.append(PartFile(src, name, what, relative, expected))
    return PlannedPart(part, files, entry, result)


def _check_size(entry: ShardEntry, path: Path, expected: int, what: str, requeue: str) -> None:
    size = os.stat(path).st_size
    if size != expected:
        raise IntegrityError(
            f"accepted {what} {path} has {size} bytes, its record says {expected}",
            where=f"shard {entry.shard_id}",
            hint=f"it was modified after publication; {requeue}",
        )


def parts_index(manifest: Manifest, parts: list[ExportPart]) -> PartsIndex:
    return PartsIndex(
        job_id=manifest.job_id,
        content_sha256=manifest.content_sha256,
        num_parts=len(parts),
        rows=sum(p.rows for p in parts),
        bytes=sum(p.bytes for p in parts),
        parts=parts,
    )


def part_files(part: ExportPart) -> list[tuple[str, tuple[int, int, str]]]:
    """``(name, (rows, bytes, sha256))`` of each file of ``part`` in the export, its output first."""
    return [(part.name, (part.rows, part.bytes, part.sha256)), *side_files.beside_part(part)]


def expected_names(parts: list[ExportPart]) -> list[str]:
    """Every name the export directory holds, in index order (the index last)."""
    return [*(name for part in parts for name, _ in part_files(part)), PARTS_INDEX]


def name_difference(names: set[str], parts: list[ExportPart]) -> tuple[list[str], list[str]]:
    """(missing, extra): the names the export of ``parts`` holds that ``names`` lacks, in index order, and those
    in ``names`` that are not the export's, sorted."""
    wanted = expected_names(parts)
    return [name for name in wanted if name not in names], sorted(names - set(wanted))


def read_index_bytes(target: Path) -> bytes | None:
    """The index of the export at ``target``, None when there is none."""
    return fsio.read_record(target / PARTS_INDEX, MAX_INDEX_BYTES)


def compare_existing(target: Path, index: bytes, planned: list[PlannedPart]) -> str | None:
    """None: nothing (or an empty directory) is at ``target``; :data:`IDENTICAL`: this export is there already;
    else how what is there differs, naming the part.  Reads the index and one listing, and stats each part: no
    part is read."""
    names = set(os.listdir(target)) if os.path.lexists(target) else set()
    if not names:
        return None
    try:
        data = read_index_bytes(target)
    except JobDirError as exc:
        return f"its index is not readable ({exc.message})"
    if data is None:
        return f"it holds no {PARTS_INDEX}: not a complete parts export"
    if data != index:
        return _index_difference(target, data, [p.part for p in planned])
    missing, extra = name_difference(names, [p.part for p in planned])
    if missing:
        return f"{missing[0]} is missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
    if extra:
        return f"it holds {extra[0]}, which is not part of this export"
    for file in (file for each in planned for file in each.files):
        found, size = os.lstat(target / file.name), file.expected[1]
        if not stat.S_ISREG(found.st_mode) or found.st_size != size:
            return f"{file.name} is not the file the index names ({found.st_size} bytes, the index says {size})"
    return IDENTICAL


def _index_difference(target: Path, data: bytes, parts: list[ExportPart]) -> str:
    try:
        found = PartsIndex.parse(data, target / PARTS_INDEX)
    except JobDirError as exc:
        return f"its index is torn or not a dj-elastic index ({exc.message})"
    for mine, theirs in zip(parts, found.parts, strict=False):
        if mine != theirs:
            return (
                f"{theirs.name} differs (rows={theirs.rows} sha256={theirs.sha256} there, this job's: "
                f"rows={mine.rows} sha256={mine.sha256})"
            )
    if len(found.parts) != len(parts):
        return f"it has {len(found.parts)} parts, this job {len(parts)}"
    return "its index differs from this job's"


def _stage_and_publish(
    layout: JobLayout, target: Path, index: bytes, planned: list[PlannedPart], replace: bool
) -> None:
    fsio.makedirs(target.parent)
    tag = kernel_tag()
    # a dead publication's staging and set-aside directories: removing one unlinks its names, the job's files stay
    remove_dead_merge_temps(target, tag, kinds=("tmp", "old"), remove=fsio.remove_tree)
    staging = merge_temp_path(target, tag)
    fsio.makedirs(staging)
    try:
        copied = 0
        for each in planned:
            copied += _place(layout, each, staging)
            fault_seam.fault_point("merge", staging)  # named crash point: a part placed, the export not yet
        fsio.fsync_dir(staging)  # every link durable before the index says the export is complete
        fsio.write_new(staging / PARTS_INDEX, index)  # last: its presence means complete
        fsio.fsync_dir(staging)
        fault_seam.fault_point("finalize", target)  # named crash point: complete, not yet published
        _rename_into_place(staging, target, index, planned, replace, tag)
    finally:
        if os.path.lexists(staging):
            fsio.remove_tree(staging)
    how = f"{copied} copied (another filesystem)" if copied else "all hard links"
    logger.info(f"published {len(planned)} parts into {target} ({how})")


def _place(layout: JobLayout, each: PlannedPart, staging: Path) -> int:
    """Link (or, across filesystems, copy) one part and its side files into staging; 1 when copied."""
    copied = 0
    for file in each.files:
        try:
            fsio.link_private(file.src, staging / file.name)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            _copy_validated(layout, each, file, staging / file.name)
            copied = 1
    return copied


def _copy_validated(layout: JobLayout, each: PlannedPart, file: PartFile, dst: Path) -> None:
    """A copy of an accepted file, validated against its done marker in the same read (EXDEV only)."""
    writer = fsio.BufferedCheckedWriter(dst, size_hint=file.expected[1])
    try:
        requeue = attempts.requeue_hint(layout, [each.entry.shard_id])
        check_published_file(
            layout, each.entry, each.result, what=file.what, relative=file.relative, expected=file.expected,
            requeue=requeue, sink=writer.write,
        )  # fmt: skip
        writer.finish()
    except BaseException:
        writer.abort()
        raise


def _rename_into_place(
    staging: Path, target: Path, index: bytes, planned: list[PlannedPart], replace: bool, tag: str
) -> None:
    aside = None
    if replace:  # an earlier, different parts export (overwrite): moved aside, removed once ours is in place
        aside = merge_temp_path(target, tag, kind="old")
        fsio.move(target, aside)
    try:
        fsio.move(staging, target)  # rename(2) replaces an empty directory, refuses a non-empty one
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        found = compare_existing(target, index, planned)
        if found != IDENTICAL:  # another merge published something else meanwhile
            raise OutputExistsError(
                f"a different parts export appeared at the export path while publishing: {found}",
                where=str(target),
                hint="choose another path",
            ) from None
    if aside is not None:
        fsio.remove_tree(aside)
