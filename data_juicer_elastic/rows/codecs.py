"""Compressed inputs and shards (docs/input-format.md): which codec a file uses, streaming decoded reads,
deterministic shard writers, and the reader and writer threads that overlap I/O with parsing (hashlib, zlib,
zstandard and file reads release the GIL on large buffers; memory stays bounded by the queue depth).
"""

from __future__ import annotations

import gzip
import hashlib
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, get_args

from data_juicer_elastic.errors import InputError
from data_juicer_elastic.sharedfs import fsio

Codec = Literal["none", "gzip", "zstd"]
CODECS: Final[tuple[Codec, ...]] = get_args(Codec)
SHARD_SUFFIX: Final[dict[str, str]] = {"none": ".jsonl", "gzip": ".jsonl.gz", "zstd": ".jsonl.zst"}
READ_BYTES: Final = 8 * 1024 * 1024
_PREFETCH_DEPTH: Final = 3


def input_codec(name: str) -> Codec | None:
    """The codec of an input file name, None when it is not a JSONL input."""
    return next((codec for codec, suffix in SHARD_SUFFIX.items() if name.endswith(suffix)), None)


class _CountingFile:
    """A read-only file object for decompressors that counts the raw bytes it hands out."""

    def __init__(self, handle: Any):
        self._handle = handle
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._handle.read(n if n is not None and n > 0 else READ_BYTES)
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


def iter_decoded(path: Path, codec: Codec, block: int = READ_BYTES) -> Iterator[bytes]:
    """The decoded bytes of ``path`` in blocks of at most ``block`` bytes; corrupt compression is an InputError."""
    with fsio.open_read(path) as handle:
        raw = _CountingFile(handle)
        if codec == "none":
            while data := raw.read(block):
                yield data
            return
        try:
            yield from _decompress(raw, codec, block)
        except (OSError, EOFError, zlib.error, ValueError) as exc:
            if isinstance(exc, OSError) and exc.errno is not None:
                raise  # a real I/O error, not corrupt data
            raise InputError(
                f"corrupt {codec} data after {raw.size} compressed bytes: {exc}",
                where=str(path),
                hint="check the file with gzip -t / zstd -t, or re-create it",
            ) from None


def _decompress(raw: _CountingFile, codec: Codec, block: int) -> Iterator[bytes]:
    if codec == "gzip":
        # GzipFile reads every member and checks each CRC and length; bounded reads keep
        # a small, highly compressed file from expanding into memory at once.
        stream = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[arg-type]
    else:
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
    """One thread that runs hashing and writing in submission order, at most ``depth`` tasks behind, while the
    caller keeps parsing.  The first failure is raised at the next ``submit``/``drain``, and again at every later
    one."""

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
                    task[0](*task[1])
            except BaseException as exc:  # reported to the caller
                self._error = exc
            finally:
                self._tasks.task_done()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._error is not None:
            raise self._error
        self._tasks.put((fn, args))

    def drain(self) -> None:
        self._tasks.join()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self._tasks.put(None)
        self._thread.join()


# -- shard writers ----------------------------------------------------------------------------
class ShardFileWriter:
    """Writes one shard's copy, stored with ``codec``; hashes the stored bytes."""

    def __init__(self, path: Path, codec: Codec):
        self._stored = hashlib.sha256()
        self.stored_bytes = 0
        self._writer = fsio.BufferedCheckedWriter(Path(path))
        self._compress = _compressor(codec)

    def write(self, data: bytes | memoryview) -> None:
        self._stored_write(data if self._compress is None else self._compress.compress(data))

    def _stored_write(self, data: bytes | memoryview) -> None:
        if data:
            self._stored.update(data)
            self.stored_bytes += len(data)
            self._writer.write(data)

    def finish(self) -> tuple[int, str]:
        """(stored bytes, stored sha256) after a checked close and fsync."""
        try:
            if self._compress is not None:
                self._stored_write(self._compress.flush())
            self._writer.finish()
        except BaseException:
            self._writer.abort()
            raise
        return self.stored_bytes, self._stored.hexdigest()

    def abort(self) -> None:
        self._writer.abort()


def _compressor(codec: Codec) -> Any:
    if codec == "none":
        return None
    if codec == "gzip":
        # wbits 31: a gzip wrapper whose header carries no name and mtime 0 (deterministic).
        return zlib.compressobj(1, zlib.DEFLATED, 31)
    import zstandard

    return zstandard.ZstdCompressor(level=3, threads=0, write_content_size=False).compressobj()
