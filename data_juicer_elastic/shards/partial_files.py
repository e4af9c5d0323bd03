"""The streaming merge's files beside the export: ``<export>.partial`` and the row stats' partial, each opened
with ``O_NOFOLLOW`` (a link at a partial's name is refused).  :class:`PartialLock` keeps one writer per partial
output, across processes and threads; the row stats' partial is written only by the holder of the output's lock.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import MergeBusyError, OutputExistsError
from data_juicer_elastic.rows.codecs import READ_BYTES
from data_juicer_elastic.shards.merge import OutputAppender
from data_juicer_elastic.sharedfs import fault_seam

_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


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


class AppendWriter:
    """Appends to a locked partial file; errors name it."""

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

    def finish(self) -> None:
        self.sync()

    def abort(self) -> None:
        pass  # the partial stays: everything up to its final size is still valid


@dataclass
class PartialStream:
    """One partial file as its writer holds it: the final bytes and their hash."""

    path: Path
    fd: int
    digest: Any  # a hashlib sha256 object holding the final bytes; None when they were trusted, not read
    bytes: int
    sha: str  # sha256 (hex) of the final bytes
    mtime_ns: int | None = None  # the file's, once they were fsynced
    appender: OutputAppender | None = None
    writer: AppendWriter | None = None

    @classmethod
    def fresh(cls, path: Path, fd: int) -> PartialStream:
        os.ftruncate(fd, 0)
        return cls(path, fd, hashlib.sha256(), 0, hashlib.sha256().hexdigest())

    def append(self, block: bytes) -> None:
        assert self.digest is not None, "a trusted prefix holds every shard: nothing is appended to it"
        if self.appender is None:
            self.writer = AppendWriter(self.path, self.fd)
            self.appender = OutputAppender(self.writer, digest=self.digest)
        self.appender.append(block)

    def make_final(self) -> None:
        """Everything appended so far is written, fsynced and hashed: record it as final."""
        if self.appender is None or self.writer is None:
            return
        self.appender.drain()
        self.writer.sync()  # durable before a progress record says so
        self.bytes += self.appender.bytes
        self.appender.bytes = 0
        self.sha, self.mtime_ns = self.appender.digest.copy().hexdigest(), os.fstat(self.fd).st_mtime_ns

    def finish(self) -> None:
        if self.appender is not None:
            self.appender.finish()

    def abort(self) -> None:
        if self.appender is not None:
            self.appender.abort()


def resume_stream(path: Path, fd: int, final: int, sha: str, mtime_ns: int | None, trust: bool) -> PartialStream | None:
    """The stream a progress record describes (``final`` bytes hashing to ``sha``), None when the file does not
    hold them.  ``trust``: no read when the file still has exactly that size and the recorded mtime (its writer
    validated and hashed every byte as it appended it)."""
    info = os.fstat(fd)
    if info.st_size < final:
        return None
    if trust and info.st_size == final and mtime_ns is not None and info.st_mtime_ns == mtime_ns:
        return PartialStream(path, fd, None, final, sha, mtime_ns)
    os.ftruncate(fd, final)  # drop a torn shard after the final prefix
    digest = hashlib.sha256()
    if hash_prefix(fd, final, digest) != sha:
        return None
    return PartialStream(path, fd, digest, final, sha, os.fstat(fd).st_mtime_ns)


def hash_prefix(fd: int, size: int, digest) -> str:
    offset = 0
    while offset < size:
        block = os.pread(fd, min(READ_BYTES, size - offset), offset)
        if not block:
            break
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()
