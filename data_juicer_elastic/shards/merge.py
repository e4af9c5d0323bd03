"""The one merge path: every accepted shard output re-checked as it is copied, appended in manifest order, fsynced,
published at the export path with its side files (``side_files``); merge.json records it.

:func:`follow_merge` appends to ``<export>.partial`` while shards complete, publishing the final prefix as it grows
(made final by ``<export>.progress.json``; the consumer contract and the crash and resume rules:
docs/input-format.md, "Streaming ordered merge").  :func:`merge_job` is the same loop over a new temp file, every
shard already done, or the partial finished.  The merged bytes depend only on the accepted outputs in manifest
order, so any node may merge, and merging twice gives the same file: an existing identical output is success, a
different one is refused unless ``overwrite``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from loguru import logger

from data_juicer_elastic.dedup.phase_progress import removed_rows
from data_juicer_elastic.errors import (
    ElasticError,
    IntegrityError,
    JobDirError,
    MergeBusyError,
    preview,
    storage_errors,
)
from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.exports import (
    CleanRecord,
    MergedShard,
    MergedSideFile,
    MergeRecord,
    check_export_path,
    cleaned_error,
    export_stats_path,
    merge_places,
)
from data_juicer_elastic.jobdir.layout import JobLayout, check_layout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import Manifest, Record, ShardEntry, ShardResult
from data_juicer_elastic.jobdir.shard_state import Markers, ShardState, decide_state, read_markers
from data_juicer_elastic.shards import steps
from data_juicer_elastic.shards.merge_files import (
    AppendStream,
    PartialLock,
    merge_temp_path,
    open_partial,
    remove_dead_merge_temps,
    resume_stream,
)
from data_juicer_elastic.shards.side_files import publish_merged, stage_row_stats, streamed_row_stats
from data_juicer_elastic.sharedfs import fault_seam, fsio
from data_juicer_elastic.sharedfs.identity import kernel_tag


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
    dedup: tuple[dict[str, Any], ...] = ()  # the rows each deduplicator removed (merge.json's dedup)

    def to_details(self) -> dict[str, Any]:
        """What a run's outcome record keeps of the merge (``coordination.run.Outcome.details``), for every instance to
        report; read back by :meth:`from_details` (the row stats are not kept)."""
        fields = ("rows", "bytes", "sha256", "shards", "written", "layout")
        details = {"output_path": str(self.output_path)} | {name: getattr(self, name) for name in fields}
        if self.quarantined is not None:
            details["quarantined"] = {**dataclasses.asdict(self.quarantined), "path": str(self.quarantined.path)}
        if self.dedup:
            details["dedup"] = list(self.dedup)
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
            dedup=tuple(details.get("dedup") or ()),
        )


@dataclass(frozen=True)
class MergeProgress(Record):
    """How much of ``<export>.partial`` is final (owned here: only the follower writes it)."""

    KIND: ClassVar[str] = "merge-progress"
    job_id: str
    output_path: str
    partial_path: str
    num_shards: int
    shards_final: int
    bytes_final: int
    rows_final: int
    prefix_sha256: str
    complete: bool
    updated_at: float
    shards: list[MergedShard] = field(default_factory=list)
    # the partial's mtime once the record's bytes were fsynced: a prefix of every shard whose file still
    # has it (and the recorded size) is not read again on resume; None: always re-hashed
    partial_mtime_ns: int | None = None
    # the row stats' partial (<stem>_stats.jsonl.partial), the same way; None: no row stats streamed
    stats_bytes_final: int | None = None
    stats_sha256: str | None = None
    stats_mtime_ns: int | None = None


def partial_path(output: Path) -> Path:
    return output.with_name(output.name + ".partial")


def progress_path(output: Path) -> Path:
    return output.with_name(output.name + ".progress.json")


def stats_partial_path(output: Path) -> Path:
    return partial_path(export_stats_path(output))


def read_progress(output: str | Path) -> MergeProgress | None:
    """The progress record beside ``output``, None when there is none (JobDirError when corrupt)."""
    return MergeProgress.read(progress_path(Path(os.path.abspath(output))))


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


def open_export(
    job_dir: str | Path, output_path: str | Path, layout_name: str = "file"
) -> tuple[JobLayout, Manifest, Path]:
    """The job a merge (or a parts export, ``layout_name``) publishes, and its checked export path."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    check_layout(layout)  # merge.json and stats/ are written into it
    target = check_export_path(layout.root, output_path, layout=layout_name)  # never into the job dir, nor via a link
    return layout, manifest, target


@storage_errors(then="run the merge again", places=merge_places)  # ENOSPC, EROFS...: one line naming path and place
def merge_job(
    job_dir: str | Path,
    output_path: str | Path,
    overwrite: bool = False,
    *,
    stream: bool = False,
    lock_wait_secs: float = 0.0,
) -> MergeResult:
    """Merge every accepted output into ``output_path`` (JobDirError when a shard is not done).  ``stream``: finish
    the streaming merge's partial output, reading only the shards not yet appended; a follower still appending
    holds it: wait while its progress record grows, and merge into a new file when it made none for
    ``lock_wait_secs``."""
    layout, manifest, output = open_export(job_dir, output_path)
    seen = _progress_mark(output) if stream else None
    while stream:
        try:
            return _follow(layout, manifest, output, overwrite, wait=False, lock_wait_secs=lock_wait_secs)
        except MergeBusyError as exc:
            now = _progress_mark(output)
            if now == seen:
                logger.warning(f"{exc}; merging without the partial output")
                break
            seen = now
    results = accepted_results(layout, manifest)
    fsio.makedirs(output.parent)
    tag = kernel_tag()
    remove_dead_merge_temps(output, tag)
    out = AppendStream.create(merge_temp_path(output, tag), sum(result.bytes for _, result in results))
    run = _Run([], out, None, output, False, tag, sum(r.row_stats.bytes for _, r in results if r.row_stats is not None))
    try:
        return _merge(layout, manifest, run, overwrite, known=results)
    finally:
        for each in run.streams():
            fsio.remove(each.path)


def _progress_mark(export: Path) -> tuple[int, int] | None:
    """What grows while a follower appends: its record's final prefix, and the partial itself
    (one large shard takes a while to append)."""
    try:
        progress = read_progress(export)
        size = os.stat(partial_path(export)).st_size
    except (ElasticError, OSError):  # a corrupt record or no partial: nothing to wait for
        return None
    return None if progress is None else (progress.shards_final, size)


@storage_errors(then="run the merge again", places=merge_places)  # ENOSPC, EROFS...: one line naming path and place
def follow_merge(
    job_dir: str | Path,
    output_path: str | Path,
    *,
    overwrite: bool = False,
    wait: bool = True,
    poll_secs: float = 2.0,
    stop: threading.Event | None = None,
    lock_wait_secs: float = 0.0,
    publish: bool = True,
    on_progress: Callable[[MergeProgress], None] | None = None,
) -> MergeResult | None:
    """Merge shards in manifest order as they complete, publishing the final prefix as it grows.  ``wait=False``
    fails like :func:`merge_job` on a missing shard; ``wait=True`` polls every ``poll_secs`` until all are
    merged or ``stop`` is set (then None, the partial resumable).  A terminally failed shard ends it with the
    job's error.  ``publish=False`` stops after the last shard (the run's elected finalize publishes)."""
    layout, manifest, output = open_export(job_dir, output_path)
    args = dict(wait=wait, poll_secs=poll_secs, stop=stop, publish=publish, on_progress=on_progress)
    return _follow(layout, manifest, output, overwrite, lock_wait_secs=lock_wait_secs, **args)


def _follow(layout: JobLayout, manifest: Manifest, output: Path, overwrite: bool, lock_wait_secs: float, **args):
    """:func:`_merge` into the partial output, its lock held, resumed from what its progress record says."""
    publish = args.get("publish", True)
    # no output left to append: finalize confirms the export
    if (cleaned := CleanRecord.read(layout.clean_record)) is not None:
        if not publish:
            return None
        raise cleaned_error(layout, cleaned, "merging")
    fsio.makedirs(output.parent)
    partial = partial_path(output)
    if not publish and _completed(output, manifest):
        return None  # published already: nothing to follow (and no new partial to leave behind)
    lock = PartialLock(partial)
    lock.acquire(lock_wait_secs)
    try:
        if not publish and _completed(output, manifest):
            if os.fstat(lock.fd).st_size == 0:
                fsio.remove(partial)  # the empty file opening it made: we hold its lock, nobody else wrote it
            return None
        run = _resume(layout, manifest, output, partial, lock.fd)
        try:
            return _merge(layout, manifest, run, overwrite, **args)
        finally:
            if run.stats is not None:
                os.close(run.stats.fd)
    finally:
        lock.release()


def _completed(output: Path, manifest: Manifest) -> bool:
    try:
        progress = read_progress(output)
    except JobDirError:
        return False
    return progress is not None and progress.complete and progress.job_id == manifest.job_id


@dataclass
class _Run:
    merged: list[MergedShard]
    out: AppendStream
    stats: AppendStream | None
    output: Path
    partial: bool  # into <export>.partial (resumable), else into new temp files
    tag: str  # identity.kernel_tag: the temp names of the files staged (and, not partial, of the output's)
    stats_size: int = 0  # the row stats a new file will hold

    def streams(self) -> list[AppendStream]:
        return [stream for stream in (self.out, self.stats) if stream is not None]

    def stats_stream(self) -> AppendStream:
        if self.stats is None and self.partial:  # the first shard with row stats: the stats' partial starts empty
            path = stats_partial_path(self.output)
            self.stats = AppendStream.fresh(path, open_partial(path))
        elif self.stats is None:
            remove_dead_merge_temps(export_stats_path(self.output), self.tag)
            self.stats = AppendStream.create(merge_temp_path(export_stats_path(self.output), self.tag), self.stats_size)
        return self.stats


def _merge(
    layout: JobLayout,
    manifest: Manifest,
    run: _Run,
    overwrite: bool,
    *,
    known: list[tuple[ShardEntry, ShardResult]] | None = None,
    wait: bool = False,
    poll_secs: float = 2.0,
    stop: threading.Event | None = None,
    publish: bool = True,
    on_progress: Callable[[MergeProgress], None] | None = None,
) -> MergeResult | None:
    """Append every shard not yet merged, then publish.  ``known``: every accepted result, read already (a merge
    into new files, which reports its steps); else each shard's markers are read as it comes next."""
    output, partial = run.output, run.partial
    done, total = 0, None if known is None else sum(result.bytes for _, result in known)
    try:
        while len(run.merged) < manifest.num_shards:
            entry = manifest.shards[len(run.merged)]
            result = known[len(run.merged)][1] if known is not None else _next_result(layout, manifest, entry, wait)
            if result is None:
                if stop.wait(poll_secs) if stop is not None else time.sleep(poll_secs):
                    for stream in run.streams():
                        stream.finish()
                    return None  # the partial and its progress stay: a later follower resumes
                continue
            _append(layout, run, entry, result)
            fault_seam.fault_point("merge", run.out.path)  # named crash point: the shard's bytes may be torn
            if partial:
                for stream in run.streams():
                    stream.make_final()
                _publish_progress(run, manifest, complete=False, on_progress=on_progress)
            else:
                done += result.bytes
                steps.report("merge", done, total)
    except BaseException:
        for stream in run.streams():
            stream.abort()  # a partial's final prefix stays final (a later follower resumes after it); a temp goes
        raise
    for stream in run.streams():
        stream.finish()  # fsync (and a checked close) before anything is published
    if not publish:
        return None
    results = known if known is not None else accepted_results(layout, manifest)
    streamed, tag = streamed_row_stats(run.stats, results, output), run.tag
    staged = streamed or stage_row_stats(layout, results, output, tag)
    try:  # the streamed stats' partial is kept when publishing is refused: the next try resumes with it
        written, row_stats, quarantined = publish_merged(layout, results, run.out.path, output, staged, overwrite, tag)
    finally:
        if staged is not None and streamed is None:
            fsio.remove(staged.tmp)
    merged = record_merge(layout, manifest, output, run.merged, run.out.sha, written, row_stats, quarantined)
    if partial:
        _publish_progress(run, manifest, complete=True, on_progress=on_progress)
        for stream in run.streams():
            fsio.remove(stream.path)
    return merged


def _next_result(layout: JobLayout, manifest: Manifest, entry: ShardEntry, wait: bool) -> ShardResult | None:
    """The shard's accepted result; None while it is not done (``wait``), else the job's "not complete" error."""
    markers = read_markers(layout, entry.shard_id)
    refuse_corrupt_done(layout, entry.shard_id, markers)
    if decide_state(markers) is ShardState.DONE:
        return markers.result
    if markers.terminal is not None or not wait:
        accepted_results(layout, manifest)  # raises the job's "not complete" error
    return None


def _append(layout: JobLayout, run: _Run, entry: ShardEntry, result: ShardResult) -> None:
    """One accepted shard's output (and row stats) appended, each validated as it is copied."""
    run.merged.append(copy_shard(layout, entry, result, run.out.append))
    if result.row_stats is not None:
        attempts.check_row_stats_file(layout, entry, result, run.stats_stream().append)


def copy_shard(layout: JobLayout, entry: ShardEntry, result: ShardResult, sink) -> MergedShard:
    """Copy one accepted output while re-validating it against its record (one read)."""
    attempts.validate_result(layout, entry, result, sink, check_row_stats=False)  # copied beside it
    return MergedShard(entry.shard_id, result.attempt_id, result.rows, result.bytes, result.sha256)


def _resume(layout: JobLayout, manifest: Manifest, output: Path, partial: Path, fd: int) -> _Run:
    """Continue from valid earlier prefixes, else start the partials over."""
    previous = None
    try:
        previous = read_progress(output)
    except JobDirError as exc:
        logger.warning(f"ignoring a corrupt merge progress record: {exc}")
    if (
        previous is not None
        and previous.job_id == manifest.job_id
        and not previous.complete
        and len(previous.shards) == previous.shards_final
        and _still_accepted(layout, previous.shards)
    ):
        every = previous.shards_final == manifest.num_shards  # complete and untouched: not read again
        out = resume_stream(partial, fd, previous.bytes_final, previous.prefix_sha256, previous.partial_mtime_ns, every)
        stats, stats_ok = None, previous.stats_bytes_final is None
        if out is not None and not stats_ok and previous.stats_sha256 is not None:
            path = stats_partial_path(output)
            stats_fd = open_partial(path)
            try:
                stats = resume_stream(
                    path, stats_fd, previous.stats_bytes_final, previous.stats_sha256, previous.stats_mtime_ns, every
                )
            finally:
                if stats is None:
                    os.close(stats_fd)
            stats_ok = stats is not None
        if out is not None and stats_ok:
            logger.info(f"resuming the streaming merge after {previous.shards_final} shards ({partial})")
            return _Run(list(previous.shards), out, stats, output, True, kernel_tag())
        logger.warning(f"the partial output does not match its progress record; starting over ({partial})")
    fsio.remove(stats_partial_path(output))  # a new one is made by the first shard with row stats
    return _Run([], AppendStream.fresh(partial, fd), None, output, True, kernel_tag())


def _still_accepted(layout: JobLayout, shards: list[MergedShard]) -> bool:
    """Whether each merged shard is still its shard's accepted result (not requeued and run again)."""
    results = ((read_markers(layout, shard.shard_id).result, shard) for shard in shards)
    return all(r is not None and (r.attempt_id, r.sha256) == (s.attempt_id, s.sha256) for r, s in results)


def _publish_progress(run: _Run, manifest: Manifest, *, complete: bool, on_progress) -> None:
    stats = run.stats
    progress = MergeProgress(
        job_id=manifest.job_id,
        output_path=str(run.output),
        partial_path=str(run.out.path),
        num_shards=manifest.num_shards,
        shards_final=len(run.merged),
        bytes_final=run.out.bytes,
        rows_final=sum(m.rows for m in run.merged),
        prefix_sha256=run.out.sha,
        complete=complete,
        updated_at=time.time(),
        shards=list(run.merged),
        partial_mtime_ns=run.out.mtime_ns,
        stats_bytes_final=None if stats is None else stats.bytes,
        stats_sha256=None if stats is None else stats.sha,
        stats_mtime_ns=None if stats is None else stats.mtime_ns,
    )
    fsio.atomic_write(progress_path(run.output), progress.encode())
    if on_progress is not None:
        on_progress(progress)


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
        dedup=removed_rows(layout, manifest),
    )
    fsio.atomic_write(layout.merge_record, record.encode())
    how = "published as parts in" if layout_name == "parts" else "merged into"
    logger.info(f"{len(merged)} shards, {rows} rows {how} {output}" + ("" if written else " (unchanged)"))
    return MergeResult(
        output, rows, size, sha, len(merged), written, row_stats, quarantined, layout_name, tuple(record.dedup)
    )
