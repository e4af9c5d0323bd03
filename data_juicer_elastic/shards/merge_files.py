"""The files a merge writes beside the export: the one append stream (:class:`AppendStream`) every merged file is
written through, the temp names a merge uses and cleans after a killed one, and the streaming merge's partials
(each opened with ``O_NOFOLLOW``: a link at a partial's name is refused) with :class:`PartialLock`, one writer per
partial output across processes and threads (the row stats' partial is written only by the holder of the output's).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.errors import MergeBusyError, OutputExistsError
from data_juicer_elastic.rows.codecs import READ_BYTES, BackgroundIO
from data_juicer_elastic.sharedfs import fault_seam, fsio
from data_juicer_elastic.sharedfs.identity import pid_alive

SYNC_EVERY: Final = 256 * 1024 * 1024

_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


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


class AppendStream:
    """One file the merge appends validated blocks to, written and hashed on a background thread so that
    validation (reader thread hashing, this thread parsing) and the copy overlap (codecs.BackgroundIO).

    ``bytes`` and ``sha`` are the final bytes: what :meth:`make_final` (or :meth:`finish`) last made durable;
    ``digest`` is None for a partial's prefix that was trusted, not read (nothing is appended to it).  A new file
    (:meth:`create`) starts writeback on a helper thread every SYNC_EVERY bytes, so the final fsync before
    publication has little left to wait for; :meth:`abort` removes it.  A partial's stays: everything up to its
    final size is still valid."""

    def __init__(self, path: Path, writer: Any, fd: int, digest: Any, final: int = 0, mtime_ns: int | None = None):
        self.path, self.writer, self.fd, self.digest = path, writer, fd, digest
        self.bytes, self.mtime_ns, self.pending = final, mtime_ns, 0
        self.sha = digest.hexdigest() if digest is not None else ""
        self._io: BackgroundIO | None = None
        self._unsynced, self._synced = 0, None  # _synced: the early fsync in flight
        self._fsync = None

    @classmethod
    def create(cls, path: Path, size_hint: int) -> AppendStream:
        """A new file at ``path`` (``O_EXCL``, its space reserved: ``fsio.preallocate``)."""
        stream = cls(path, fsio.BufferedCheckedWriter(path, size_hint=size_hint), -1, hashlib.sha256())
        stream._fsync = ThreadPoolExecutor(1, thread_name_prefix="dj-elastic-fsync")
        return stream

    @classmethod
    def fresh(cls, path: Path, fd: int) -> AppendStream:
        """The partial at ``path`` (open as ``fd``, its lock held) started over, empty."""
        os.ftruncate(fd, 0)
        return cls(path, PartialWriter(path, fd), fd, hashlib.sha256())

    def _write(self, block: bytes) -> None:
        self.digest.update(block)
        self.writer.write(block)
        self._unsynced += len(block)
        if self._fsync is not None and self._unsynced >= SYNC_EVERY:
            self._wait_sync()  # at most one early fsync in flight
            self._synced = self._fsync.submit(fsio.fsync_file, self.path)
            self._unsynced = 0

    def _wait_sync(self) -> None:
        synced, self._synced = self._synced, None
        if synced is not None:
            synced.result()  # raises the fsync's error, naming the file

    def append(self, block: bytes) -> None:
        assert self.digest is not None, "a trusted prefix holds every shard: nothing is appended to it"
        if self._io is None:
            self._io = BackgroundIO()
        self.pending += len(block)
        self._io.submit(self._write, block)

    def _final(self) -> None:
        self.bytes, self.pending, self.sha = self.bytes + self.pending, 0, self.digest.copy().hexdigest()

    def make_final(self) -> None:
        """Everything appended so far is written, fsynced and hashed: record it as final (a partial's)."""
        if self._io is None:
            return
        self._io.drain()
        self.writer.sync()  # durable before a progress record says so
        self._final()
        self.mtime_ns = os.fstat(self.fd).st_mtime_ns

    def finish(self) -> None:
        appended = self._io is not None
        try:
            if self._io is not None:
                self._io.drain()
        finally:
            self._close_threads()
        if appended or self.fd < 0:  # a new file is closed (checked) even when nothing was appended
            self.writer.finish()
            self._final()

    def _close_threads(self) -> None:
        io, self._io = self._io, None
        if io is not None:
            io.close()
        if self._fsync is not None:
            try:
                self._wait_sync()
            finally:
                self._fsync.shutdown(wait=True)
                self._fsync = None

    def abort(self) -> None:
        with contextlib.suppress(BaseException):  # aborting already: the caller's error is the one to see
            if self._io is not None:
                self._io.drain()
        with contextlib.suppress(BaseException):
            self._close_threads()
        self.writer.abort()


class PartialWriter:
    """Appends to a locked partial file; errors name it; :meth:`abort` leaves it (its final prefix is valid)."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd
        os.lseek(fd, 0, os.SEEK_END)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            fault_seam.fault_point("write", self.path)
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:  # os.write names no file: the error must (a full export filesystem)
            raise fault_seam.named_os_error(exc, self.path, "write") from exc

    def sync(self) -> None:
        try:
            fault_seam.fault_point("fsync", self.path)
            os.fsync(self.fd)
        except OSError as exc:
            raise fault_seam.named_os_error(exc, self.path, "fsync") from exc

    finish = sync

    def abort(self) -> None:
        pass


def open_partial(path: Path) -> int:
    """A read-write descriptor of the partial file (created when absent)."""
    fault_seam.fault_point("open", path)
    try:  # O_NOFOLLOW: a symlink at a .partial name is refused (ELOOP), never written through
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise OutputExistsError(
            "a symlink is at the partial output; the streaming merge never writes through it",
            where=str(path),
            hint="remove the link",
        ) from None


class PartialLock:
    """Exclusive right to write one partial output: a POSIX lock (dropped by the kernel when its holder dies)
    and an in-process lock (POSIX locks do not exclude threads of one process)."""

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
            self.fd = open_partial(self.path)
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
                self.fd = open_partial(self.path)
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


def resume_stream(path: Path, fd: int, final: int, sha: str, mtime_ns: int | None, trust: bool) -> AppendStream | None:
    """The stream a progress record describes (``final`` bytes hashing to ``sha``), None when the file does not
    hold them.  ``trust``: no read when the file still has exactly that size and the recorded mtime (its writer
    validated and hashed every byte as it appended it)."""
    info = os.fstat(fd)
    if info.st_size < final:
        return None
    if trust and info.st_size == final and mtime_ns is not None and info.st_mtime_ns == mtime_ns:
        stream = AppendStream(path, PartialWriter(path, fd), fd, None, final, mtime_ns)
        stream.sha = sha
        return stream
    os.ftruncate(fd, final)  # drop a torn shard after the final prefix
    digest = hashlib.sha256()
    if hash_prefix(fd, final, digest) != sha:
        return None
    return AppendStream(path, PartialWriter(path, fd), fd, digest, final, os.fstat(fd).st_mtime_ns)


def hash_prefix(fd: int, size: int, digest) -> str:
    offset = 0
    while offset < size:
        block = os.pread(fd, min(READ_BYTES, size - offset), offset)
        if not block:
            break
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()
