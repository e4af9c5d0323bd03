"""Compressed inputs and shards: which codec a file uses, streaming reads that hash the
raw bytes as they pass, shard writers, and the reader thread that overlaps them.

Inputs may be ``.jsonl``, ``.jsonl.gz`` (any number of gzip members) or ``.jsonl.zst``
(any number of zstd frames).  An input's fingerprint is the sha256 of its bytes *as
stored* (what ``sha256sum`` prints), computed in the same read that decodes it.
Shards are written uncompressed or with ``shard_codec`` (``gzip`` level 1 with a
zeroed header time, or ``zstd`` level 3, single-threaded): both are deterministic,
so the same input always gives byte-identical shards.

hashlib, zlib, zstandard and file reads all release the GIL on large buffers, so
a reader thread (:func:`prefetch`) runs read + hash + decompress while the main
thread parses rows.  Memory stays bounded by the queue depth times the block size.
"""

from __future__ import annotations

import gzip
import hashlib
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, get_args

from data_juicer_elastic.errors import InputError
from data_juicer_elastic.sharedfs import checked_writer, fsio

Codec = Literal["none", "gzip", "zstd"]
CODECS: Final[tuple[Codec, ...]] = get_args(Codec)
SHARD_SUFFIX: Final[dict[str, str]] = {"none": ".jsonl", "gzip": ".jsonl.gz", "zstd": ".jsonl.zst"}
INPUT_SUFFIXES: Final[tuple[tuple[str, Codec], ...]] = (
    (".jsonl", "none"),
    (".jsonl.gz", "gzip"),
    (".jsonl.zst", "zstd"),
)
READ_BYTES: Final = 8 * 1024 * 1024
_GZIP_LEVEL: Final = 1
_ZSTD_LEVEL: Final = 3
_PREFETCH_DEPTH: Final = 3


def input_codec(name: str) -> Codec | None:
    """The codec of an input file name, None when it is not a JSONL input."""
    for suffix, codec in INPUT_SUFFIXES:
        if name.endswith(suffix):
            return codec
    return None


class _HashingFile:
    """A read-only file object for decompressors that hashes and counts the raw bytes it hands out."""

    def __init__(self, handle: Any, digest: Any):
        self._handle = handle
        self.digest = digest
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._handle.read(n if n is not None and n > 0 else READ_BYTES)
        self.digest.update(data)
        self.size += len(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        pass  # the caller closes the real file

    @property
    def closed(self) -> bool:
        return False


class RawStats:
    """What the reader saw of one input file as stored: bytes and sha256 (filled when read to the end)."""

    def __init__(self) -> None:
        self.size = 0
        self.sha256 = ""


def iter_decoded(path: Path, codec: Codec, stats: RawStats, block: int = READ_BYTES) -> Iterator[bytes]:
    """The decoded bytes of ``path`` in blocks of at most ``block`` bytes; ``stats`` gets the raw
    size and sha256 once the file is read to its end.  Corrupt compression is an InputError."""
    digest = hashlib.sha256()
    with fsio.open_read(path) as handle:
        raw = _HashingFile(handle, digest)
        if codec == "none":
            while data := raw.read(block):
                yield data
        else:
            try:
                yield from _decompress(raw, codec, block)
                while raw.read(block):  # whatever a decompressor left unread still belongs to the fingerprint
                    pass
            except (OSError, EOFError, zlib.error, ValueError) as exc:
                if isinstance(exc, OSError) and exc.errno is not None:
                    raise  # a real I/O error, not corrupt data
                raise InputError(
                    f"corrupt {codec} data after {raw.size} compressed bytes: {exc}",
                    where=str(path),
                    hint="check the file with gzip -t / zstd -t, or re-create it",
                ) from None
    stats.size, stats.sha256 = raw.size, digest.hexdigest()


def _decompress(raw: _HashingFile, codec: Codec, block: int) -> Iterator[bytes]:
    if codec == "gzip":
        # GzipFile reads every member and checks each CRC and length; bounded reads keep
        # a small, highly compressed file from expanding into memory at once.
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:  # type: ignore[arg-type]
            while data := stream.read(block):
                yield data
        return
    # Arrow's zstd stream reads every frame, bounds each read, and - unlike python-zstandard's
    # stream reader - reports a truncated last frame instead of ending quietly.
    import pyarrow

    stream = pyarrow.CompressedInputStream(pyarrow.PythonFile(raw, mode="r"), "zstd")
    with stream:
        while data := stream.read(block):
            yield data


# -- the reader thread ------------------------------------------------------------------------
_DONE: Final = object()
_Item = TypeVar("_Item")


def prefetch(make: Callable[[], Iterator[_Item]], depth: int = _PREFETCH_DEPTH) -> Iterator[_Item]:
    """Run ``make()``'s iterator in a thread, ``depth`` items ahead; exceptions re-raised here.

    Closing the returned generator (or an exception in the consumer) stops the thread.
    """
    items: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for item in make():
                while not stop.is_set():
                    try:
                        items.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put(_DONE)
        except BaseException as exc:  # handed to the consumer, which raises it
            items.put(exc)

    thread = threading.Thread(target=run, name="dj-elastic-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a put() waiting on a full queue
            try:
                items.get_nowait()
            except queue.Empty:
                thread.join(0.05)


class BackgroundIO:
    """One thread that runs hashing and writing in submission order, at most ``depth`` tasks behind.

    The caller keeps parsing while blocks are hashed and written (both release the
    GIL).  The first failure is raised to the caller at its next ``submit``/``drain``.
    """

    def __init__(self, depth: int = _PREFETCH_DEPTH + 1):
        self._tasks: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dj-elastic-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            try:
                if task is None:
                    return
                if self._error is None:
                    fn, args, box = task
                    box.append(fn(*args))
            except BaseException as exc:  # reported to the caller
                self._error = exc
            finally:
                self._tasks.task_done()

    def submit(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """Queue ``fn(*args)``; the returned list holds its result once :meth:`drain` returned."""
        if self._error is not None:
            self._raise()
        box: list[Any] = []
        self._tasks.put((fn, args, box))
        return box

    def drain(self) -> None:
        """Wait for every queued task; raise the first failure."""
        self._tasks.join()
        if self._error is not None:
            self._raise()

    def _raise(self) -> None:
        error, self._error = self._error, None
        self._error = error  # stays failed: later submits refuse too
        raise error  # type: ignore[misc]

    def close(self) -> None:
        self._tasks.put(None)
        self._thread.join()


class Syncer:
    """fsync on a helper thread, so the disk's writeback overlaps parsing and writing.

    Callers that promise durability (prepare before the manifest, merge before
    publishing) call :meth:`wait`, which raises the first error, naming the file.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dj-elastic-fsync")
        self._futures: list[Future[None]] = []

    def fsync(self, path: Path) -> None:
        self._futures.append(self._pool.submit(fsio.fsync_file, path))

    def wait(self) -> None:
        try:
            for future in self._futures:
                future.result()
        finally:
            self._futures.clear()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


# -- shard writers ----------------------------------------------------------------------------
class ShardFileWriter:
    """Writes one shard: hashes the normalised content and, with a codec, the stored bytes too."""

    def __init__(self, path: Path, codec: Codec, size_hint: int = 0):
        self.path = Path(path)
        self.codec = codec
        self.content = hashlib.sha256()
        self.content_bytes = 0
        self.rows = 0
        self._stored = hashlib.sha256() if codec != "none" else self.content
        self.stored_bytes = 0
        self._writer = checked_writer.BufferedCheckedWriter(self.path, size_hint=size_hint if codec == "none" else 0)
        self._compress = _compressor(codec)

    def write(self, data: bytes | memoryview, rows: int) -> None:
        self.content.update(data)
        self.content_bytes += len(data)
        self.rows += rows
        if self._compress is None:
            self._stored_write(data)
        else:
            self._stored_write(self._compress.compress(data))

    def _stored_write(self, data: bytes | memoryview) -> None:
        if not data:
            return
        if self._stored is not self.content:
            self._stored.update(data)
        self.stored_bytes += len(data)
        self._writer.write(data)

    def finish(self, durable: bool = True) -> tuple[str, int, str]:
        """(content sha256, stored bytes, stored sha256) after a checked close (and fsync if ``durable``)."""
        try:
            if self._compress is not None:
                self._stored_write(self._compress.flush())
            self._writer.finish(durable)
        except BaseException:
            self._writer.abort()
            raise
        return self.content.hexdigest(), self.stored_bytes, self._stored.hexdigest()

    def abort(self) -> None:
        self._writer.abort()


def _compressor(codec: Codec) -> Any:
    if codec == "none":
        return None
    if codec == "gzip":
        # wbits 31: a gzip wrapper whose header carries no name and mtime 0 (deterministic).
        return zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31)
    import zstandard

    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL, threads=0, write_content_size=False).compressobj()
