"""Streaming ordered merge: publish the finished prefix of the merged output while shards complete
(``<export>.partial``, made final by ``<export>.progress.json``).  The consumer contract and the crash and
resume rules: docs/input-format.md, "Streaming ordered merge".
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from loguru import logger

from data_juicer_elastic.errors import JobDirError, storage_errors
from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.exports import CleanRecord, MergedShard, check_export_path, cleaned_error, merge_places
from data_juicer_elastic.jobdir.layout import JobLayout, check_layout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import Manifest, Record, ShardEntry, ShardResult
from data_juicer_elastic.jobdir.row_files import MergedSideFile, export_stats_path
from data_juicer_elastic.jobdir.shard_state import ShardState, decide_state, read_markers
from data_juicer_elastic.shards.merge import (
    MergeResult,
    StagedFile,
    accepted_results,
    copy_shard,
    publish_merged,
    record_merge,
    refuse_corrupt_done,
    stage_row_stats,
)
from data_juicer_elastic.shards.partial_files import PartialLock, PartialStream, open_partial, resume_stream
from data_juicer_elastic.sharedfs import fault_seam, fsio
from data_juicer_elastic.sharedfs.identity import kernel_tag


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
    fails like :func:`merge.merge_job` on a missing shard; ``wait=True`` polls every ``poll_secs`` until all are
    merged or ``stop`` is set (then None, the partial resumable).  A terminally failed shard ends it with the
    job's error.  ``publish=False`` stops after the last shard (the run's elected finalize publishes)."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    check_layout(layout)  # merge.json and stats/ are written into it, as by merge_job
    output = check_export_path(layout.root, output_path)  # never into the job dir, never through a link
    if (
        cleaned := CleanRecord.read(layout.clean_record)
    ) is not None:  # no output left to append: finalize confirms the export
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
            return _follow(layout, manifest, run, overwrite, wait, poll_secs, stop, publish, on_progress)
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
    out: PartialStream
    stats: PartialStream | None
    output: Path

    def streams(self) -> list[PartialStream]:
        return [stream for stream in (self.out, self.stats) if stream is not None]

    def stats_stream(self) -> PartialStream:
        if self.stats is None:  # the first shard with row stats: the stats' partial starts empty
            path = stats_partial_path(self.output)
            self.stats = PartialStream.fresh(path, open_partial(path))
        return self.stats


def _follow(layout, manifest, run: _Run, overwrite, wait, poll_secs, stop, publish, on_progress):
    output = run.output
    try:
        while len(run.merged) < manifest.num_shards:
            entry = manifest.shards[len(run.merged)]
            markers = read_markers(layout, entry.shard_id)
            refuse_corrupt_done(layout, entry.shard_id, markers)
            if decide_state(markers) is not ShardState.DONE:
                if markers.terminal is not None or not wait:
                    accepted_results(layout, manifest)  # raises the job's "not complete" error
                if stop.wait(poll_secs) if stop is not None else time.sleep(poll_secs):
                    for stream in run.streams():
                        stream.finish()
                    return None  # the partial and its progress stay: a later follower resumes
                continue
            _append(layout, run, entry, markers.result)
            fault_seam.fault_point("merge", run.out.path)  # named crash point: the shard's bytes may be torn
            for stream in run.streams():
                stream.make_final()
            _publish_progress(run, manifest, complete=False, on_progress=on_progress)
    except BaseException:
        for stream in run.streams():
            stream.abort()  # what is final stays final: a later follower resumes after it
        raise
    for stream in run.streams():
        stream.finish()
    if not publish:
        return None
    results = accepted_results(layout, manifest)
    streamed, tag = _streamed_row_stats(run, results, output), kernel_tag()
    staged = streamed or stage_row_stats(layout, results, output, tag)
    # <export>_errors.jsonl is written whole here; the streamed stats' partial is kept when publishing
    # is refused: the next try resumes with it
    written, row_stats, quarantined = publish_merged(
        layout, results, run.out.path, output, staged, overwrite, tag, keep_stats=streamed is not None
    )
    result = record_merge(layout, manifest, output, run.merged, run.out.sha, written, row_stats, quarantined)
    _publish_progress(run, manifest, complete=True, on_progress=on_progress)
    for stream in run.streams():
        fsio.remove(stream.path)
    return result


def _append(layout: JobLayout, run: _Run, entry: ShardEntry, result: ShardResult) -> None:
    """One accepted shard's output (and row stats) appended, each validated as it is copied."""
    run.merged.append(copy_shard(layout, entry, result, run.out.append))
    if result.row_stats is not None:
        attempts.check_row_stats_file(layout, entry, result, run.stats_stream().append)


def _streamed_row_stats(run: _Run, results: list, output: Path) -> StagedFile | None:
    """The row stats' partial as the file to publish, when it holds exactly the accepted row stats files (each
    validated as it was appended); None: write them whole instead."""
    with_stats = [r.row_stats for _, r in results if r.row_stats is not None]
    missing = [r for _, r in results if r.row_stats is None and r.rows]
    if run.stats is None or not with_stats or missing or run.stats.bytes != sum(s.bytes for s in with_stats):
        return None
    rows = sum(r.rows for _, r in results if r.row_stats is not None)
    record = MergedSideFile(export_stats_path(output), rows, run.stats.bytes, run.stats.sha, written=False)
    return StagedFile(run.stats.path, record)


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
            return _Run(list(previous.shards), out, stats, output)
        logger.warning(f"the partial output does not match its progress record; starting over ({partial})")
    fsio.remove(stats_partial_path(output))  # a new one is made by the first shard with row stats
    return _Run([], PartialStream.fresh(partial, fd), None, output)


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
