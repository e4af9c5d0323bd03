"""Prepare's row validation in helper processes: parsing is the one part of a scan that holds the GIL.

A child answers one question per byte range: is every line proven clean by the fast path
(:meth:`RowNormaliser.is_clean`)?  "Yes" comes with the range's row schema; "no", or a dead child, sends the range
through the serial path, which words the exact ``file:line`` error.  A child runs the same code, so it never
decides differently; uncompressed files it reads itself (``pread``).  Children are plain ``python -m`` processes,
not multiprocessing workers: those would re-import the parent's ``__main__`` (dj-process imports all of
Data-Juicer), and forking a process that runs threads is unsafe.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future
from dataclasses import asdict
from typing import Final

from loguru import logger

from data_juicer_elastic.rows.jsonl import NormaliseOptions, RowNormaliser
from data_juicer_elastic.rows.row_schema import RowSchema

# seq, offset, length, path bytes (0: `length` payload bytes follow) /
# seq, rows, verdict, schema bytes (the range's row schema as JSON follows a clean verdict)
_REQUEST: Final = struct.Struct("<QQQI")
_REPLY: Final = struct.Struct("<QQBI")
MIN_PARALLEL_BYTES: Final = 64 * 1024 * 1024  # below this, starting interpreters costs more than it saves
MAX_PROCESSES: Final = 8
MAX_BLOCKS_IN_FLIGHT: Final = 12  # x 8 MiB read blocks held while their verdicts are pending


def pipeline_depth(processes: int) -> int:
    """Blocks to keep in flight: two per helper (one checked, one queued) and two for slack."""
    return min(MAX_BLOCKS_IN_FLIGHT, 2 * processes + 2)


def default_processes(total_bytes: int) -> int:
    """Helper processes worth starting for ``total_bytes`` of input rows: one per usable core (taskset, cpusets).
    Measured on 2 cores (1 GB, 16 shards): 0 helpers 3.1-3.2 s, 1 helper 2.8-3.0 s, 2 helpers 2.4-2.6 s, 3-4
    helpers 2.5-3.0 s: the parent mostly waits on I/O and hashing."""
    if total_bytes < MIN_PARALLEL_BYTES:
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_PROCESSES, cores))


class RowCheckers:
    """A pool of checker processes for ``options`` (NormaliseOptions); :meth:`check` returns a Future of ``(rows,
    clean, schema)`` (the range's RowSchema, None unless clean).  Futures fail (never hang) when a child dies or
    none could start; callers then take the serial path."""

    def __init__(self, processes: int, options):
        config = json.dumps(asdict(options)).encode()
        self._tasks: queue.Queue = queue.Queue()
        self._children: list[subprocess.Popen] = []
        self._threads: list[threading.Thread] = []
        self._seq = 0
        self.processes = processes
        self._lock = threading.Lock()  # guards _alive against check(): no task is queued for no one
        self._failure: BaseException | None = None
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        for i in range(processes):
            try:
                child = subprocess.Popen(
                    [sys.executable, "-m", "data_juicer_elastic.rows.row_checkers"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                    bufsize=0,
                )
            except OSError as exc:  # no process to be had: fewer helpers (none: every block checked here)
                logger.warning(f"could not start a row checker process ({exc}); checking rows in this process")
                self._failure = exc
                break
            self._children.append(child)
            name = f"dj-elastic-check-{i}"
            self._threads.append(threading.Thread(target=self._serve, args=(child, config), name=name, daemon=True))
        self._alive = len(self._threads)
        for thread in self._threads:
            thread.start()

    def check(self, path: str | None, offset: int, length: int, data: bytes | memoryview | None = None) -> Future:
        """Whether ``length`` bytes of whole lines are clean: read by the child from ``path`` at ``offset``, or
        given as ``data`` when ``path`` is None."""
        future: Future = Future()
        with self._lock:
            if not self._alive:
                future.set_exception(self._failure or EOFError("no row checker process is running"))
                return future
            self._seq += 1
            self._tasks.put((future, self._seq, path, offset, length, data))
        return future

    def _serve(self, child: subprocess.Popen, config: bytes) -> None:
        """One thread per child: send a request, wait for its reply (pipe I/O releases the GIL)."""
        try:
            _write_all(child.stdin, struct.pack("<I", len(config)) + config)
        except BaseException as exc:  # noqa: BLE001 - the child is already gone
            self._retire(exc)
            return
        while True:
            task = self._tasks.get()
            if task is None:
                return
            future, seq, path, offset, length, data = task
            try:
                name = os.fsencode(path) if path is not None else b""
                _write_all(child.stdin, _REQUEST.pack(seq, offset, length, len(name)) + name)
                if path is None:
                    _write_all(child.stdin, data)
                reply = _read_exact(child.stdout, _REPLY.size)
                got, rows, verdict, schema_len = _REPLY.unpack(reply)
                schema = RowSchema.from_json(json.loads(_read_exact(child.stdout, schema_len))) if schema_len else None
                if got != seq:
                    raise RuntimeError(f"row checker answered request {got}, expected {seq}")
                if verdict == 1 and schema is None:
                    raise RuntimeError(f"row checker sent no row schema with request {seq}")
                future.set_result((rows, verdict == 1, schema))
            except BaseException as exc:  # the child died or the pipe broke: this task fails
                logger.warning(f"a row checker process stopped ({exc!r}); its blocks are checked in this process")
                future.set_exception(exc)
                self._retire(exc)
                return

    def _retire(self, exc: BaseException) -> None:
        """A serving thread stops; the last one fails every queued task (the others take them otherwise)."""
        with self._lock:
            self._alive -= 1
            if self._alive:
                return
            self._failure = exc
            while True:
                try:
                    task = self._tasks.get_nowait()
                except queue.Empty:
                    return
                if task is not None:
                    task[0].set_exception(exc)

    def close(self) -> None:
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join(timeout=10)
        for child in self._children:
            with contextlib.suppress(OSError):
                child.stdin.close()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            child.stdout.close()


def _write_all(stream, data: bytes | memoryview) -> None:
    """An unbuffered pipe may take part of a large write; hand it the rest until it took all."""
    view = memoryview(data)
    while view:
        view = view[stream.write(view) :]


def _read_exact(stream, n: int) -> bytes:
    parts, need = [], n
    while need:
        chunk = stream.read(need)
        if not chunk:
            raise EOFError("row checker process ended")
        parts.append(chunk)
        need -= len(chunk)
    return b"".join(parts)


# -- the child ------------------------------------------------------------------------------
def _serve_requests() -> None:
    import signal

    # Ctrl-C reaches the whole process group: the parent decides, and ends us by closing stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    (size,) = struct.unpack("<I", _read_exact(stdin, 4))
    options = NormaliseOptions(**json.loads(_read_exact(stdin, size)))
    normaliser = RowNormaliser("", options, 0)
    limit = options.max_line_bytes
    files: dict[bytes, int] = {}
    while True:
        try:
            header = _read_exact(stdin, _REQUEST.size)
        except EOFError:
            return
        seq, offset, length, name_len = _REQUEST.unpack(header)
        if name_len:
            name = _read_exact(stdin, name_len)
            if name not in files:
                if len(files) > 64:
                    for fd in files.values():
                        os.close(fd)
                    files.clear()
                files[name] = os.open(name, os.O_RDONLY)
            data = os.pread(files[name], length, offset)
        else:
            data = _read_exact(stdin, length)
        lines = data.split(b"\n")
        schema = RowSchema()
        verdict = len(data) == length and lines.pop() == b"" and bool(lines) and max(map(len, lines)) <= limit
        verdict = verdict and normaliser.is_clean(lines, schema)
        encoded = json.dumps(schema.to_json(), separators=(",", ":")).encode() if verdict else b""
        stdout.write(_REPLY.pack(seq, len(lines), 1 if verdict else 0, len(encoded)) + encoded)
        stdout.flush()


if __name__ == "__main__":
    _serve_requests()
