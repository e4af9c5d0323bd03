"""Writing a new file so that every error surfaces, naming the file: :class:`CheckedWriter` (one
``O_EXCL`` file; write, fsync *and close* errors raised: NFS reports ENOSPC and EDQUOT at close)
and :class:`BufferedCheckedWriter` (streaming, the space reserved up front by :func:`preallocate`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from data_juicer_elastic.sharedfs.fault_seam import fault_done, fault_point, named_os_error

CHUNK: Final = 1024 * 1024  # the write buffer; also fsio's read chunk


class CheckedWriter:
    """A file opened O_EXCL whose write, fsync *and close* errors all surface, naming the path."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd = -1
        fault_point("create", self.path)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fault_done("create", self.path)
        except BaseException:
            self.abort()  # the caller never gets this writer: do not leak the fd or the file
            raise

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        try:
            fault_point("write", self.path)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
            fault_done("write", self.path)
        except OSError as exc:
            raise named_os_error(exc, self.path, "write") from exc
        return len(data)

    def finish(self, durable: bool = True) -> None:
        try:
            if durable:
                try:
                    fault_point("fsync", self.path)
                    os.fsync(self.fd)
                    fault_done("fsync", self.path)
                except OSError as exc:
                    raise named_os_error(exc, self.path, "fsync") from exc
        finally:
            fd, self.fd = self.fd, -1
            try:
                fault_point("close", self.path)
                os.close(fd)
                fault_done("close", self.path)
            except OSError as exc:
                raise named_os_error(exc, self.path, "close") from exc

    def abort(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self.path)


_FALLOC_FL_KEEP_SIZE: Final = 1
_fallocate: Callable[[int, int, int, int], int] | None | bool = False  # False: not looked up yet


def preallocate(fd: int, size: int) -> bool:
    """Reserve ``size`` bytes of disk for a file about to be written, without changing its size: its
    extents are allocated once, and space runs out before the first byte (benchmarks/README.md).  A
    hint, any failure ignored; fallocate(2) itself, as glibc's posix_fallocate would *emulate* it
    where the filesystem cannot (NFSv3: a write in every 4 KiB block)."""
    global _fallocate
    if _fallocate is False:
        _fallocate = _load_fallocate()
    return _fallocate is not None and size > 0 and _fallocate(fd, _FALLOC_FL_KEEP_SIZE, 0, size) == 0


def _load_fallocate():
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.fallocate
    except (OSError, AttributeError):  # not Linux/glibc: no hint
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    function.restype = ctypes.c_int
    return function


class BufferedCheckedWriter:
    """Streaming writer for large outputs (shards, merged file); ``size_hint``: the bytes expected."""

    def __init__(self, path: Path, buffer_bytes: int = CHUNK, size_hint: int = 0):
        self._raw = CheckedWriter(path)
        if size_hint > 0:
            preallocate(self._raw.fd, size_hint)
        self._buffer = bytearray()
        self._limit = buffer_bytes
        self.path = self._raw.path

    def write(self, data: bytes | memoryview) -> None:
        if len(data) >= self._limit:  # a large block gains nothing from a copy into the buffer
            self.flush()
            self._raw.write(data)
            return
        self._buffer += data
        if len(self._buffer) >= self._limit:
            self.flush()

    def flush(self) -> None:
        if self._buffer:
            self._raw.write(bytes(self._buffer))
            self._buffer.clear()

    def finish(self, durable: bool = True) -> None:
        try:
            self.flush()
        except BaseException:
            self._raw.abort()
            raise
        self._raw.finish(durable)

    def abort(self) -> None:
        self._buffer.clear()
        self._raw.abort()
