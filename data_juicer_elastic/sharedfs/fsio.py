"""Every file operation on a job directory, with the care shared filesystems need (what they do and
do not guarantee: docs/leases-on-nfs.md).  Everything goes through these functions and writers so
that the fault-injection seam (``sharedfs.fault_seam``) sees it.  A new file is written so that every
error surfaces, naming the file: :class:`CheckedWriter` (one ``O_EXCL`` file; write, fsync *and
close* errors raised: NFS reports ENOSPC and EDQUOT at close) and :class:`BufferedCheckedWriter`
(streaming, the space reserved up front by :func:`preallocate`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Final, TypeVar

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.sharedfs.fault_seam import fault_done, fault_point, named_os_error

MAX_RECORD_BYTES: Final = 4 * 1024 * 1024
CHUNK: Final = 1024 * 1024  # the read chunk; also the write buffer (BufferedCheckedWriter)
_LINK_ATTEMPTS: Final = 4
_READ_ATTEMPTS: Final = 3
_AMBIGUOUS_ERRNOS: Final = frozenset({errno.EIO, errno.ESTALE, errno.ETIMEDOUT})
READ_THREADS: Final = 8  # reads in flight at once (read_many)
_Item, _Read = TypeVar("_Item"), TypeVar("_Read")


# -- directories ----------------------------------------------------------------------------
def makedirs(path: Path) -> None:
    fault_point("makedirs", path)
    os.makedirs(path, exist_ok=True)


def fsync_dir(path: Path) -> None:
    """Persist directory entries (a new link or rename) against a server/client crash."""
    fault_point("fsync_dir", path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # some filesystems refuse opening directories; the entry is still published
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def list_names(path: Path) -> list[str]:
    """Sorted entry names; [] when the directory does not exist.  Listings are cached on
    NFS, so callers use them as hints and open the names they care about."""
    fault_point("listdir", path)
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def move(src: Path, dst: Path) -> None:
    """Rename a private path into place (not first-wins; callers make sure of that)."""
    fault_point("rename", dst)
    os.rename(src, dst)
    fault_done("rename", dst)
    fsync_dir(Path(dst).parent)


def remove(path: Path) -> None:
    fault_point("unlink", path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove_tree(path: Path) -> None:
    fault_point("rmtree", path)
    shutil.rmtree(path, ignore_errors=True)


# -- reading --------------------------------------------------------------------------------
def _open_rb(op: str, path: Path) -> BinaryIO:
    """open(path, "rb"), retrying a transient ESTALE (an NFS handle that went stale between
    lookup and open: opening the name again gets a fresh handle).  Bounded, then raised."""
    for attempt in range(_READ_ATTEMPTS):
        try:
            fault_point(op, path)
            return open(path, "rb")
        except OSError as exc:
            if exc.errno != errno.ESTALE or attempt == _READ_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def read_record(path: Path, max_bytes: int = MAX_RECORD_BYTES) -> bytes | None:
    """The bytes of a small record, or None if it does not exist.  Opens the file (revalidating NFS
    caches) and reads at most ``max_bytes + 1`` bytes: a corrupt or hostile file cannot exhaust memory."""
    for attempt in range(_READ_ATTEMPTS):
        try:
            handle = _open_rb("read", path)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise JobDirError("expected a record file, found a directory", where=str(path)) from None
        try:
            with handle:
                data = _read_at_most(handle, max_bytes + 1)
            break
        except OSError as exc:  # ESTALE while reading: the file was replaced under us; read it again
            if exc.errno != errno.ESTALE or attempt == _READ_ATTEMPTS - 1:
                raise OSError(exc.errno, f"read failed: {exc.strerror}", str(path)) from exc
    if len(data) > max_bytes:
        raise JobDirError(f"record larger than {max_bytes} bytes; corrupt or not a dj-elastic file", where=str(path))
    return data


def _read_at_most(handle: BinaryIO, limit: int) -> bytes:
    """Up to ``limit`` bytes, read in blocks: ``read(limit)`` would allocate ``limit`` bytes up
    front, and the manifest's limit is hundreds of MiB for a record of a few KiB."""
    parts, size = [], 0
    while size < limit:
        part = handle.read(min(CHUNK, limit - size))
        if not part:
            break
        parts.append(part)
        size += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_many(read: Callable[[_Item], _Read], items: Iterable[_Item]) -> list[_Read]:
    """``[read(item) for item in items]``, :data:`READ_THREADS` at a time: on NFS each open is a
    round trip to the server, and threads overlap them (reads release the GIL)."""
    items = list(items)
    if len(items) <= 1:
        return [read(item) for item in items]
    with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
        return list(pool.map(read, items))


def exists(path: Path) -> bool:
    """Whether a file exists, asked by opening it (fresher than stat on NFS)."""
    try:
        with _open_rb("open", path):
            return True
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        return True


def open_read(path: Path) -> BinaryIO:
    return _open_rb("open", path)


def iter_chunks(path: Path, chunk: int = CHUNK) -> Iterator[bytes]:
    with open_read(path) as handle:
        while block := handle.read(chunk):
            yield block


def file_sha256(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of a file, streamed."""
    with open_read(path) as handle:
        digest = hashlib.file_digest(handle, "sha256")
        return handle.tell(), digest.hexdigest()


def stat(path: Path) -> os.stat_result:
    """stat of an *input* file (fingerprints), not of job state."""
    fault_point("stat", path)
    return os.stat(path)


# -- writing --------------------------------------------------------------------------------
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


def temp_path_for(target: Path) -> Path:
    """A private name beside ``target`` (same directory: same filesystem for link/rename)."""
    target = Path(target)
    return target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def write_new(path: Path, data: bytes, durable: bool = True) -> None:
    """Create ``path`` exclusively with ``data`` (fails if it exists); removed again on error."""
    writer = CheckedWriter(path)
    try:
        writer.write(data)
        writer.finish(durable)
    except BaseException:
        writer.abort()
        raise


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new bytes, never a mix (temp file,
    fsync, checked close, ``os.replace``, directory fsync).  Last writer wins: only for files one
    owner rewrites (heartbeats, attempt.json, merge.json)."""
    path = Path(path)
    tmp = temp_path_for(path)
    write_new(tmp, data, durable)
    try:
        fault_point("replace", path)
        os.replace(tmp, path)
        fault_done("replace", path)
    except OSError as exc:
        # A retransmitted NFS rename can report EIO/ESTALE for a rename that happened:
        # our private temp name is then gone and the target holds our bytes.
        if not (exc.errno in _AMBIGUOUS_ERRNOS and not _present(tmp) and read_record(path, len(data)) == data):
            remove(tmp)
            raise
    except BaseException:
        remove(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fault_point("fsync", path)
        os.fsync(fd)
        fault_done("fsync", path)
    except OSError as exc:
        raise named_os_error(exc, Path(path), "fsync") from exc
    finally:
        os.close(fd)


def _present(path: Path) -> bool:
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


# -- exclusive publication ------------------------------------------------------------------
def publish_exclusive(src: Path, dst: Path) -> bool:
    """Make ``src`` visible at ``dst`` unless something else is already there: True when ``dst`` now
    holds our bytes, False when another publisher got there first.  An EEXIST/EIO/ESTALE answer is
    checked by re-reading ``dst``: a retransmitted NFS ``link`` can fail for a link that succeeded,
    and then ``dst`` holds exactly our content (which embeds our attempt id: equal bytes mean ours)."""
    src, dst = Path(src), Path(dst)
    last: OSError | None = None
    for _ in range(_LINK_ATTEMPTS):
        try:
            fault_point("link", dst)
            os.link(src, dst)
            fault_done("link", dst)
        except FileExistsError:
            return same_bytes(src, dst) is True
        except OSError as exc:
            if exc.errno not in _AMBIGUOUS_ERRNOS:
                raise
            last = exc
            same = same_bytes(src, dst)
            if same is None:
                continue  # nothing there: the link really failed; try again
            if same:
                fsync_dir(dst.parent)
            return same
        else:
            fsync_dir(dst.parent)
            return True
    assert last is not None
    raise last


def link_private(src: Path, dst: Path) -> None:
    """Hard-link ``src`` at ``dst`` in a directory only this process writes (a staging directory):
    no directory fsync (the caller makes the directory durable once, for all its links).  An
    EEXIST/EIO/ESTALE answer for a link that happened (a retransmitted NFS call) is recognised by
    ``dst`` being ``src``'s inode.  EXDEV (another filesystem) is raised: the caller copies."""
    src, dst = Path(src), Path(dst)
    try:
        fault_point("link", dst)
        os.link(src, dst)
        fault_done("link", dst)
    except OSError as exc:
        if not (isinstance(exc, FileExistsError) or exc.errno in _AMBIGUOUS_ERRNOS):
            raise
        with contextlib.suppress(OSError):
            if os.path.samestat(os.stat(src), os.lstat(dst)):
                return
        raise


def publish_bytes(dst: Path, data: bytes) -> bool:
    """Exclusively publish a small record: temp file beside ``dst``, fsync, link, unlink temp."""
    dst = Path(dst)
    tmp = temp_path_for(dst)
    write_new(tmp, data)
    try:
        return publish_exclusive(tmp, dst)
    finally:
        remove(tmp)


def replace(src: Path, dst: Path) -> None:
    """os.replace of a private temp file onto ``dst`` (last writer wins; callers decide it may)."""
    fault_point("replace", dst)
    os.replace(src, dst)
    fault_done("replace", dst)
    fsync_dir(Path(dst).parent)


def same_bytes(a: Path, b: Path) -> bool | None:
    """True/False comparing two files' contents; None when ``b`` does not exist."""
    try:
        fb = open_read(b)
    except FileNotFoundError:
        return None
    with fb, open_read(a) as fa:
        while True:
            block_a, block_b = fa.read(CHUNK), fb.read(CHUNK)
            if block_a != block_b:
                return False
            if not block_a:
                return True
