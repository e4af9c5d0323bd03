"""Validated, ordered, idempotent merge of all accepted shard outputs.

The merged bytes depend only on the accepted outputs in manifest order, so any node may merge, and merging twice
gives the same file: an existing identical output is success, a different one is refused unless ``overwrite``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.errors import IntegrityError, JobDirError, OutputExistsError, preview, storage_errors
from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.exports import (
    MergedShard,
    MergeRecord,
    check_export_path,
    merge_places,
    recorded_files,
    written_by_job,
)
from data_juicer_elastic.jobdir.layout import JobLayout, check_layout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import Manifest, ShardEntry, ShardResult
from data_juicer_elastic.jobdir.row_files import MergedSideFile, export_errors_path, export_stats_path
from data_juicer_elastic.jobdir.shard_state import Markers, ShardState, decide_state, read_markers
from data_juicer_elastic.quarantine import errors_merge
from data_juicer_elastic.rows.codecs import BackgroundIO
from data_juicer_elastic.shards import steps
from data_juicer_elastic.sharedfs import checked_writer, fault_seam, fsio
from data_juicer_elastic.sharedfs.identity import kernel_tag, pid_alive

SYNC_EVERY: Final = 256 * 1024 * 1024
Sink = Callable[[bytes], None]


@dataclass(frozen=True)
class StagedFile:
    tmp: Path  # complete and fsynced, under a temp name beside the target
    record: MergedSideFile  # what it will be once published (``written`` decided then)

    def publish(self, overwrite: bool) -> MergedSideFile:
        return dataclasses.replace(self.record, written=publish_output(self.tmp, self.record.path, overwrite))


@dataclass(frozen=True)
class MergeResult:
    output_path: Path
    rows: int
    bytes: int
    sha256: str
    shards: int
    written: bool  # False when an identical output was already there
    row_stats: MergedSideFile | None = None  # <export>_stats.jsonl, when the recipe makes per-row stats
    quarantined: MergedSideFile | None = None  # <export>_errors.jsonl, when operators failed on rows (quarantine)
    layout: str = "file"  # "parts": output_path is a directory of parts and sha256 that of its index (shards.parts)

    def to_details(self) -> dict[str, Any]:
        """What a run's outcome record keeps of the merge (``coordination.run.Outcome.details``), for every instance to
        report; read back by :meth:`from_details` (the row stats are not kept)."""
        fields = ("rows", "bytes", "sha256", "shards", "written", "layout")
        details = {"output_path": str(self.output_path)} | {name: getattr(self, name) for name in fields}
        if self.quarantined is not None:
            details["quarantined"] = {**dataclasses.asdict(self.quarantined), "path": str(self.quarantined.path)}
        return details

    @classmethod
    def from_details(cls, details: Mapping[str, Any]) -> MergeResult:
        errors = details.get("quarantined")
        quarantined = MergedSideFile(**{**errors, "path": Path(errors["path"])}) if isinstance(errors, dict) else None
        return cls(
            Path(details["output_path"]),
            int(details["rows"]),
            int(details["bytes"]),
            str(details["sha256"]),
            int(details["shards"]),
            bool(details.get("written", False)),
            quarantined=quarantined,
            layout=str(details.get("layout", "file")),
        )


def accepted_results(layout: JobLayout, manifest: Manifest) -> list[tuple[ShardEntry, ShardResult]]:
    """Every shard's accepted result in manifest order; JobDirError listing what is missing.

    Markers are opened by name, never found through a (cached) directory listing.
    """
    results, missing, failed = [], [], []
    for entry in manifest.shards:
        markers = read_markers(layout, entry.shard_id)
        refuse_corrupt_done(layout, entry.shard_id, markers)
        if decide_state(markers) is not ShardState.DONE:
            (failed if markers.terminal is not None else missing).append(entry.shard_id)
            continue
        results.append((entry, markers.result))
    if missing or failed:
        groups = (("failed", failed), ("not done", missing))
        parts = [f"{len(ids)} {what} ({preview(ids, 8)})" for what, ids in groups if ids]
        raise JobDirError(
            f"job is not complete: {'; '.join(parts)} of {manifest.num_shards} shards",
            where=str(layout.root),
            hint="run workers until every shard is done; `dj-elastic retry` requeues failed shards",
        )
    return results


def refuse_corrupt_done(layout: JobLayout, shard_id: str, markers: Markers) -> None:
    """IntegrityError when the shard's done marker cannot be read: its result is unknown, so the shard
    must run again (the hint says how)."""
    if markers.corrupt_done:
        hint = attempts.requeue_hint(layout, [shard_id])
        raise IntegrityError(f"corrupt done marker: {markers.done_error}", where=f"shard {shard_id}", hint=hint)


@storage_errors(then="run the merge again", places=merge_places)  # ENOSPC, EROFS...: one line naming path and place
def merge_job(job_dir: str | Path, output_path: str | Path, overwrite: bool = False) -> MergeResult:
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    check_layout(layout)  # merge.json and stats/ are written into it
    output = check_export_path(layout.root, output_path)  # never into the job dir, never through a link
    results = accepted_results(layout, manifest)
    fsio.makedirs(output.parent)
    tag = kernel_tag()
    remove_dead_merge_temps(output, tag)
    tmp = merge_temp_path(output, tag)
    total_bytes, done_bytes = sum(result.bytes for _, result in results), 0
    out = OutputAppender(checked_writer.BufferedCheckedWriter(tmp, size_hint=total_bytes), sync_path=tmp)
    merged = []
    try:
        for entry, result in results:
            merged.append(copy_shard(layout, entry, result, out.append))
            done_bytes += result.bytes
            steps.report("merge", done_bytes, total_bytes)
            fault_seam.fault_point("merge", tmp)  # named crash point (tests/faults/crashpoints.py)
        out.finish()  # fsync + checked close before anything is published
    except BaseException:
        out.abort()
        raise
    try:
        staged = stage_row_stats(layout, results, output, tag)
        written, row_stats, quarantined = publish_merged(layout, results, tmp, output, staged, overwrite, tag)
    finally:
        fsio.remove(tmp)
    return record_merge(layout, manifest, output, merged, out.digest.hexdigest(), written, row_stats, quarantined)


def publish_merged(
    layout: JobLayout,
    results: list[tuple[ShardEntry, ShardResult]],
    tmp: Path,
    output: Path,
    stats: StagedFile | None,
    overwrite: bool,
    tag: str,
    keep_stats: bool = False,
) -> tuple[bool, MergedSideFile | None, MergedSideFile | None]:
    """Publish the merged output (complete and fsynced at ``tmp``) and its side files, the row stats (``stats``)
    and the quarantine file (staged here), or none: every target is checked before any is published.
    (written, row stats, quarantine file).  The staged side files are removed afterwards, whatever happened; the
    row stats not when ``keep_stats`` (their owner removes them)."""
    errors = None
    try:
        parts = errors_merge.errors_parts(layout, results)  # <export>_errors.jsonl: staged like the row stats
        errors = None if parts is None else stage_concat(export_errors_path(output), tag, *parts)
        fault_seam.fault_point("finalize", output)  # named crash point: merged, not yet published
        staged = [(tmp, output), *((s.tmp, s.record.path) for s in (stats, errors) if s is not None)]
        replace = overwrite or may_replace(layout, staged)
        for new, target in staged:
            refuse_if_different(new, target, replace)
        written = publish_output(tmp, output, replace)
        sides = tuple(None if side is None else side.publish(replace) for side in (stats, errors))
        if errors is None:  # no row quarantined now: an earlier merge's file goes too
            errors_merge.remove_stale_errors(layout, output, overwrite)
        return written, *sides
    finally:
        for side in filter(None, (None if keep_stats else stats, errors)):
            fsio.remove(side.tmp)


def may_replace(layout: JobLayout, staged: list[tuple[Path, Path]]) -> bool:
    """Whether every export file the merge would change is one this job itself wrote (merge.json's hash proves it):
    after ``dj-elastic retry`` the job's result differs from its export, which the merge then replaces without
    ``overwrite``; a file edited since, or anyone else's, still needs it.  Reads merge.json only when one differs."""
    changed = [target for new, target in staged if fsio.exists(target) and not fsio.same_bytes(new, target)]
    if not changed:
        return False
    recorded = recorded_files(layout)
    return all(written_by_job(layout, target, recorded) for target in changed)


def stage_row_stats(
    layout: JobLayout, results: list[tuple[ShardEntry, ShardResult]], output: Path, tag: str
) -> StagedFile | None:
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


def stage_concat(path: Path, tag: str, size_hint: int, copies: Iterable[Callable[[Sink], int]]) -> StagedFile:
    """``path``'s file under a temp name beside it, complete and fsynced: each of ``copies`` appends its part to
    the sink it is given, validated as it is copied, and returns its rows (in merge order)."""
    remove_dead_merge_temps(path, tag)
    tmp = merge_temp_path(path, tag)
    out = OutputAppender(checked_writer.BufferedCheckedWriter(tmp, size_hint=size_hint), sync_path=tmp)
    rows = 0
    try:
        for copy in copies:
            rows += copy(out.append)
        out.finish()
    except BaseException:
        out.abort()
        raise
    return StagedFile(tmp, MergedSideFile(path, rows, out.bytes, out.digest.hexdigest(), written=False))


def merge_temp_path(output: Path, tag: str, kind: str = "tmp") -> Path:
    """``.<export>.<kind>-<kernel tag>-<pid>-<random>`` beside the export: same filesystem for the final link or
    rename, and named so that a later merge on this host can tell a dead merger's file."""
    return output.with_name(f".{output.name}.{kind}-{tag}-{os.getpid()}-{secrets.token_hex(4)}")


def remove_dead_merge_temps(
    output: Path, tag: str, kinds: tuple[str, ...] = ("tmp",), remove: Callable[[Path], None] = fsio.remove
) -> None:
    """Remove the temps (:func:`merge_temp_path`, of ``kinds``) of merges into ``output`` killed on this host
    (SIGKILL, OOM, power loss skips every cleanup): each holds up to a whole merged output, and nothing else will
    ever remove it.  Only names tagged with this kernel namespace whose pid is gone: another host's merge, or a
    live one here, is never touched (``tag``: identity.kernel_tag; ``remove``: a parts export's remove_tree)."""
    if not tag:
        return
    prefixes = tuple(f".{output.name}.{kind}-{tag}-" for kind in kinds)
    try:
        listed = os.listdir(output.parent)
    except OSError:
        return  # cleaning is a courtesy; the merge's own writes there report a real problem
    for name, prefix in ((n, p) for n in listed for p in prefixes if n.startswith(p)):
        pid = name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        path = output.parent / name
        try:
            found = path.stat()
            remove(path)
        except OSError:
            continue  # gone already (another merge cleaned it), or not ours to remove
        size = "" if stat.S_ISDIR(found.st_mode) else f" ({found.st_size} bytes)"
        logger.info(f"removed {path}{size}, left by a merge killed on this host (pid {pid})")


class OutputAppender:
    """Appends validated blocks to the merged output on a background thread, hashing them there, so validation
    (reader thread hashing, this thread parsing) and the copy overlap (codecs.BackgroundIO).  With ``sync_path``,
    writeback of what is written starts on a helper thread every SYNC_EVERY bytes, so the final fsync before
    publication has little left to wait for."""

    def __init__(self, writer, digest=None, sync_path: Path | None = None):
        self.writer = writer
        self.digest = digest if digest is not None else hashlib.sha256()
        self.bytes = 0
        self._io = BackgroundIO()
        self._sync_path, self._unsynced, self._synced = sync_path, 0, None  # _synced: the early fsync in flight
        self._fsync = ThreadPoolExecutor(1, thread_name_prefix="dj-elastic-fsync") if sync_path else None

    def _write(self, block: bytes) -> None:
        self.digest.update(block)
        self.writer.write(block)
        self._unsynced += len(block)
        if self._fsync is not None and self._unsynced >= SYNC_EVERY:
            self._wait_sync()  # at most one early fsync in flight
            self._synced = self._fsync.submit(fsio.fsync_file, self._sync_path)
            self._unsynced = 0

    def _wait_sync(self) -> None:
        synced, self._synced = self._synced, None
        if synced is not None:
            synced.result()  # raises the fsync's error, naming the file

    def append(self, block: bytes) -> None:
        self.bytes += len(block)
        self._io.submit(self._write, block)

    def drain(self) -> None:
        self._io.drain()

    def finish(self) -> None:
        try:
            self._io.drain()
        finally:
            self._io.close()
            self._close_syncer()
        self.writer.finish()

    def _close_syncer(self) -> None:
        if self._fsync is not None:
            try:
                self._wait_sync()
            finally:
                self._fsync.shutdown(wait=True)
                self._fsync = None

    def abort(self) -> None:
        with contextlib.suppress(BaseException):  # aborting already: the caller's error is the one to see
            self._io.drain()
        self._io.close()
        with contextlib.suppress(BaseException):
            self._close_syncer()
        self.writer.abort()


def record_merge(
    layout: JobLayout,
    manifest: Manifest,
    output: Path,
    merged: list[MergedShard],
    sha: str,
    written: bool,
    row_stats: MergedSideFile | None,
    quarantined: MergedSideFile | None = None,
    layout_name: str = "file",
) -> MergeResult:
    """Write merge.json for a published output (or parts export); the MergeResult callers report."""
    rows, size = sum(m.rows for m in merged), sum(m.bytes for m in merged)
    record = MergeRecord(
        output_path=str(output),
        rows=rows,
        bytes=size,
        sha256=sha,
        job_id=manifest.job_id,
        content_sha256=manifest.content_sha256,
        shards=merged,
        merged_at=time.time(),
        row_stats_path=None if row_stats is None else str(row_stats.path),
        row_stats_sha256=None if row_stats is None else row_stats.sha256,
        errors_rows=0 if quarantined is None else quarantined.rows,
        errors_path=None if quarantined is None else str(quarantined.path),
        errors_sha256=None if quarantined is None else quarantined.sha256,
        layout=layout_name,
    )
    fsio.atomic_write(layout.merge_record, record.encode())
    how = "published as parts in" if layout_name == "parts" else "merged into"
    logger.info(f"{len(merged)} shards, {rows} rows {how} {output}" + ("" if written else " (unchanged)"))
    return MergeResult(output, rows, size, sha, len(merged), written, row_stats, quarantined, layout_name)


def copy_shard(layout: JobLayout, entry: ShardEntry, result: ShardResult, sink) -> MergedShard:
    """Copy one accepted output while re-validating it against its record (one read)."""
    attempts.validate_result(layout, entry, result, sink, check_row_stats=False)  # copied later
    return MergedShard(entry.shard_id, result.attempt_id, result.rows, result.bytes, result.sha256)


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
