"""Streaming ordered merge: publish the finished prefix of the merged output while shards complete.

A follower (``dj-elastic merge --follow``, or every instance of a run with ``export_layout:
file`` and ``elastic.stream_merge`` on, the default) appends each accepted shard output,
validated exactly as :mod:`merge` does, to ``<export>.partial`` as soon as every shard before
it is merged, and after each shard publishes ``<export>.progress.json``:

    {"format": "dj-elastic/merge-progress", "shards_final": 3, "num_shards": 16,
     "bytes_final": 123456, "rows_final": 789, "prefix_sha256": "...", "complete": false, ...}

Consumer contract: read the progress record (replaced atomically), then read at most
``bytes_final`` bytes of ``<export>.partial``; those bytes are final, fsynced, whole
lines, and never change (the file only grows).  When ``complete`` is true the whole
output is at the export path (the same inode: the partial is linked there, then its
``.partial`` name removed), byte-identical to a non-streaming merge of the same job,
and ``merge.json`` is written as by :func:`merge.merge_job`.  The per-row stats file
(``<export>_stats.jsonl``, :mod:`row_stats`) is not streamed: it is written whole just
before the output is published.

Crash and resume (the ``merge`` and ``finalize`` crash points of
:mod:`coordination.crashpoints` stop a follower there): bytes past ``bytes_final`` may be a
torn shard; a new follower truncates them, re-hashes the prefix against ``prefix_sha256`` (starting over when it
does not match, or when a shard it names was run again since) and continues with shard ``shards_final``.  A
prefix that already holds every shard, in a file whose size and mtime are still those recorded, is not
read again: each shard was validated and hashed as it was appended and fsynced before the record said
so, and ``prefix_sha256`` is then the whole output's hash, so finalize publishes it after reading only
the done markers (``dj-elastic verify`` re-hashes the export; an edit that restores size and mtime is
not caught before that).
One writer per partial: a POSIX lock on the partial file (released by the kernel when a follower dies)
plus an in-process lock, because POSIX locks do not exclude threads of one process; a lock won on a
partial that was published (and its name removed) meanwhile is given up.  A follower that does not publish
(a run's) finds a completed record and returns at once.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from loguru import logger

from data_juicer_elastic.errors import IntegrityError, JobDirError, MergeBusyError, OutputExistsError, storage_errors
from data_juicer_elastic.jobdir import confine
from data_juicer_elastic.jobdir.export_path import check_export_path
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import Manifest, Record
from data_juicer_elastic.jobdir.result_records import MergedShard
from data_juicer_elastic.jobdir.shard_state import ShardState, decide_state, read_markers
from data_juicer_elastic.rows.codecs import READ_BYTES
from data_juicer_elastic.shards.merge import (
    MergeResult,
    OutputAppender,
    accepted_results,
    copy_shard,
    publish_merged,
    record_merge,
    stage_row_stats,
)
from data_juicer_elastic.sharedfs import fault_seam, fsio
from data_juicer_elastic.sharedfs.identity import kernel_tag

PARTIAL_SUFFIX: Final = ".partial"
PROGRESS_SUFFIX: Final = ".progress.json"

_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


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


def partial_path(output: Path) -> Path:
    return output.with_name(output.name + PARTIAL_SUFFIX)


def progress_path(output: Path) -> Path:
    return output.with_name(output.name + PROGRESS_SUFFIX)


def read_progress(output: str | Path) -> MergeProgress | None:
    """The progress record beside ``output``, None when there is none (JobDirError when corrupt)."""
    path = progress_path(Path(os.path.abspath(output)))
    data = fsio.read_record(path)
    return None if data is None else MergeProgress.parse(data, path)


class _PartialLock:
    """Exclusive right to write one partial file, across processes and threads."""

    def __init__(self, path: Path):
        self.path = path
        with _process_locks_guard:
            self._thread_lock = _process_locks.setdefault(str(path), threading.Lock())
        self.fd = -1
        self._held = False

    def acquire(self, wait_secs: float = 0.0, poll_secs: float = 0.2) -> None:
        deadline = time.monotonic() + wait_secs
        while not self._thread_lock.acquire(timeout=max(0.0, min(poll_secs, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise self._busy()
        self._held = True
        try:
            fault_seam.fault_point("open", self.path)
            try:  # O_NOFOLLOW: a symlink at <export>.partial is refused (ELOOP), never written through
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                raise OutputExistsError(
                    "a symlink is at the partial output; the streaming merge never writes through it",
                    where=str(self.path),
                    hint="remove the link",
                ) from None
            while True:
                try:
                    fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno not in (errno.EACCES, errno.EAGAIN) or time.monotonic() >= deadline:
                        raise self._busy() from None
                    time.sleep(poll_secs)
                    continue
                if self._still_the_partial():
                    return
                # The holder we waited for published this file (the export is now this inode) and removed
                # its .partial name: never write to it; open the name again.
                os.close(self.fd)
                self.fd = -1
                fault_seam.fault_point("open", self.path)
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except BaseException:
            self.release()
            raise

    def _still_the_partial(self) -> bool:
        try:
            return os.path.samestat(os.fstat(self.fd), os.lstat(self.path))
        except FileNotFoundError:
            return False

    def _busy(self) -> MergeBusyError:
        return MergeBusyError(
            "another merge is writing this partial output",
            where=str(self.path),
            hint="wait for it (its progress is in the .progress.json beside it), or stop it first",
        )

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the POSIX lock
            self.fd = -1
        if self._held:
            self._held = False
            self._thread_lock.release()


@storage_errors(then="run the merge again")  # ENOSPC, EIO...: one line naming the path, exit 2
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
    """Merge shards in manifest order as they complete, publishing the final prefix as it grows.

    ``wait=False`` merges what is done and fails like :func:`merge.merge_job` on a missing
    shard; ``wait=True`` polls for the next shard every ``poll_secs`` until all are merged
    or ``stop`` is set (then returns None, leaving a resumable partial).  A terminally
    failed shard ends the follow with the job's error.  ``publish=False`` stops after the
    last shard without publishing (the run's elected finalize publishes).
    """
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    confine.check_layout(layout)  # merge.json and stats/ are written into it, as by merge_job
    output = check_export_path(layout.root, output_path)  # never into the job dir, never through a link
    fsio.makedirs(output.parent)
    partial = partial_path(output)
    if not publish and _completed(output, manifest):
        return None  # published already: nothing to follow (and no new partial to leave behind)
    lock = _PartialLock(partial)
    lock.acquire(lock_wait_secs)
    try:
        if not publish and _completed(output, manifest):
            if os.fstat(lock.fd).st_size == 0:
                fsio.remove(partial)  # the empty file opening it made: we hold its lock, nobody else wrote it
            return None
        return _follow(
            layout, manifest, output, partial, lock.fd, overwrite, wait, poll_secs, stop, publish, on_progress
        )
    finally:
        lock.release()


def _completed(output: Path, manifest: Manifest) -> bool:
    try:
        progress = read_progress(output)
    except JobDirError:
        return False
    return progress is not None and progress.complete and progress.job_id == manifest.job_id


def _follow(layout, manifest, output, partial, fd, overwrite, wait, poll_secs, stop, publish, on_progress):
    state = _resume(layout, manifest, output, partial, fd)
    writer = _AppendWriter(partial, fd)
    out = OutputAppender(writer, digest=state.digest)
    try:
        while len(state.merged) < manifest.num_shards:
            entry = manifest.shards[len(state.merged)]
            markers = read_markers(layout, entry.shard_id)
            if markers.corrupt_done:
                raise IntegrityError(f"corrupt done marker: {markers.done_error}", where=f"shard {entry.shard_id}")
            result = markers.result
            if decide_state(markers) is not ShardState.DONE:
                if markers.terminal is not None or not wait:
                    accepted_results(layout, manifest)  # raises the job's "not complete" error
                stopped = stop.wait(poll_secs) if stop is not None else time.sleep(poll_secs)
                if stopped:
                    out.finish()
                    return None  # the partial and its progress stay: a later follower resumes
                continue
            state.merged.append(copy_shard(layout, entry, result, out.append))
            fault_seam.fault_point("merge", partial)  # named crash point: the shard's bytes may be torn, unrecorded
            out.drain()
            writer.sync()  # durable before the progress record says so
            state.sha, state.mtime_ns = out.digest.copy().hexdigest(), os.fstat(fd).st_mtime_ns
            _publish_progress(state, manifest, output, partial, complete=False, on_progress=on_progress)
        out.finish()
    except BaseException:
        out.abort()
        raise
    if not publish:
        return None
    sha = state.sha
    # The per-row stats file is written whole at the end (it is not streamed).
    staged = stage_row_stats(layout, accepted_results(layout, manifest), output, kernel_tag())
    fault_seam.fault_point("finalize", output)  # named crash point: complete and fsynced, not yet published
    written, row_stats = publish_merged(partial, output, staged, overwrite)
    result = record_merge(layout, manifest, output, state.merged, sha, written, row_stats)
    _publish_progress(state, manifest, output, partial, complete=True, on_progress=on_progress)
    fsio.remove(partial)
    return result


@dataclass
class _State:
    digest: Any  # a hashlib sha256 object holding the prefix; None for a complete prefix not read again
    merged: list[MergedShard]
    bytes: int
    sha: str  # the prefix's sha256 (hex)
    mtime_ns: int | None = None  # the partial's, once the prefix was fsynced


def _resume(layout: JobLayout, manifest: Manifest, output: Path, partial: Path, fd: int) -> _State:
    """Continue from a valid earlier prefix, else start the partial over."""
    previous = None
    try:
        previous = read_progress(output)
    except JobDirError as exc:
        logger.warning(f"ignoring a corrupt merge progress record: {exc}")
    if previous is not None and previous.job_id == manifest.job_id and not previous.complete:
        size = os.fstat(fd).st_size
        if (
            size >= previous.bytes_final
            and len(previous.shards) == previous.shards_final
            and _still_accepted(layout, previous.shards)
        ):
            merged, final = list(previous.shards), previous.bytes_final
            if previous.shards_final == manifest.num_shards and _untouched(fd, previous):
                logger.info(f"the streaming merge holds every shard already ({partial})")
                return _State(None, merged, final, previous.prefix_sha256, previous.partial_mtime_ns)
            os.ftruncate(fd, final)  # drop a torn shard after the final prefix
            digest = hashlib.sha256()
            if _hash_prefix(fd, final, digest) == previous.prefix_sha256:
                logger.info(f"resuming the streaming merge after {previous.shards_final} shards ({partial})")
                return _State(digest, merged, final, previous.prefix_sha256, os.fstat(fd).st_mtime_ns)
        logger.warning(f"the partial output does not match its progress record; starting over ({partial})")
    os.ftruncate(fd, 0)
    return _State(hashlib.sha256(), [], 0, hashlib.sha256().hexdigest())


def _untouched(fd: int, previous: MergeProgress) -> bool:
    """The partial is as the record's writer left it: its size, and its mtime after the last fsync."""
    info = os.fstat(fd)
    return info.st_size == previous.bytes_final and info.st_mtime_ns == previous.partial_mtime_ns


def _still_accepted(layout: JobLayout, shards: list[MergedShard]) -> bool:
    """Whether each merged shard is still its shard's accepted result (not requeued and run again)."""
    for shard in shards:
        result = read_markers(layout, shard.shard_id).result
        if result is None or (result.attempt_id, result.sha256) != (shard.attempt_id, shard.sha256):
            return False
    return True


def _hash_prefix(fd: int, size: int, digest) -> str:
    offset = 0
    while offset < size:
        block = os.pread(fd, min(READ_BYTES, size - offset), offset)
        if not block:
            break
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()


class _AppendWriter:
    """Appends to the locked partial file; errors name it (the fsio seam sees every call)."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd
        os.lseek(fd, 0, os.SEEK_END)

    def write(self, data: bytes) -> None:
        fault_seam.fault_point("write", self.path)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def sync(self) -> None:
        fault_seam.fault_point("fsync", self.path)
        os.fsync(self.fd)

    def finish(self) -> None:
        self.sync()

    def abort(self) -> None:
        pass  # the partial stays: everything up to bytes_final is still valid


def _publish_progress(state, manifest, output, partial, *, complete, on_progress) -> None:
    rows = sum(m.rows for m in state.merged)
    size = sum(m.bytes for m in state.merged)
    progress = MergeProgress(
        job_id=manifest.job_id,
        output_path=str(output),
        partial_path=str(partial),
        num_shards=manifest.num_shards,
        shards_final=len(state.merged),
        bytes_final=size,
        rows_final=rows,
        prefix_sha256=state.sha,
        partial_mtime_ns=state.mtime_ns,
        complete=complete,
        updated_at=time.time(),
        shards=list(state.merged),
    )
    fsio.atomic_write(progress_path(output), progress.encode())
    if on_progress is not None:
        on_progress(progress)
