"""Scan one shard: read its spans once, check every row (``rows.jsonl.RowNormaliser``), observe its row
schema, hash, copy.  The first bad row is a deterministic *refusal* naming its line in the span.  The steps:
docs/input-format.md, "Planning, scanning and reading shards".
"""

from __future__ import annotations

import hashlib
import sys
from collections import deque
from pathlib import Path
from typing import Any, NoReturn

from data_juicer_elastic.errors import InputChangedError, InputError, ScanRefused
from data_juicer_elastic.jobdir.attempts import ScanOutput, ScanTask
from data_juicer_elastic.jobdir.records import ScanRefusal
from data_juicer_elastic.rows.codecs import READ_BYTES, ShardFileWriter, prefetch
from data_juicer_elastic.rows.jsonl import NormaliseOptions, RowNormaliser
from data_juicer_elastic.rows.line_framer import LineBlock, LineFramer, first_too_long
from data_juicer_elastic.rows.row_checkers import RowCheckers, default_processes, pipeline_depth
from data_juicer_elastic.rows.row_schema import RowSchema
from data_juicer_elastic.rows.shard_source import GONE, SourceSpan, read_span, span_change
from data_juicer_elastic.shards import steps

SCANNING = "scanning shards"  # the step name progress reports use


class _Content:
    """Where scanned content goes: a sha256, a copy (with ``copy_shards``), and the scanner's progress."""

    def __init__(self, copy_path: Path | None, codec: str, scanner: ShardScanner):
        self.digest = hashlib.sha256()
        self.bytes = 0
        self.copy = ShardFileWriter(copy_path, codec) if copy_path is not None else None
        self.scanner = scanner

    def add(self, data: bytes | memoryview) -> None:
        self.digest.update(data)
        self.bytes += len(data)
        if self.copy is not None:
            self.copy.write(data)
        self.scanner.done += len(data)
        steps.report(SCANNING, self.scanner.done, self.scanner.total)


class ShardScanner:
    """``run_scan`` for the scan loop: ``scanner(task) -> ScanOutput``.  A shard of
    ``row_checkers.MIN_PARALLEL_BYTES`` or more has its rows checked in helper processes (one per core, kept for
    the worker's later scans); a block a helper does not prove clean takes the serial path, which words the error.
    """

    def __init__(self, processes: int | None = None, total_bytes: int | None = None):
        self.processes = processes  # None: one per usable core, for large shards
        self._checkers: RowCheckers | None = None
        self._options: NormaliseOptions | None = None
        # progress (shards.steps): content bytes this scanner has read, of ``total_bytes`` when known
        self.done, self.total = 0, total_bytes

    def __call__(self, task: ScanTask) -> ScanOutput:
        content = _Content(task.copy_path, task.copy_codec, self)
        schema = RowSchema()
        span_rows: list[int] = []
        identical, longest = True, 0
        checkers = self._pool(task)
        refusal = None
        try:
            for number, span in enumerate(task.spans):
                rows, clean, span_longest = _SpanScan(number, span, task, schema, content, checkers).run()
                span_rows.append(rows)
                identical &= clean
                longest = max(longest, span_longest)
        except ScanRefused as refused:
            refusal = refused.refusal
        finally:
            if content.copy is not None and (refusal is not None or sys.exc_info()[0] is not None):
                content.copy.abort()
        stored: dict[str, Any] = {}
        if content.copy is not None and refusal is None:
            stored_bytes, stored_sha = content.copy.finish()
            stored = {"copy_path": task.copy_path}
            if task.copy_codec != "none":
                stored |= {"stored_bytes": stored_bytes, "stored_sha256": stored_sha}
        return ScanOutput(
            rows=sum(span_rows),
            bytes=content.bytes,
            sha256=content.digest.hexdigest(),
            span_rows=span_rows,
            schema=schema.to_json(),
            normalise=not identical,
            longest_line=longest,
            refusal=refusal,
            **stored,
        )

    def _pool(self, task: ScanTask) -> RowCheckers | None:
        size = sum(span.length for span in task.spans)
        wanted = default_processes(size) if self.processes is None else (self.processes if size else 0)
        if not wanted:
            return None
        if self._checkers is None or self._options != task.options:
            self.close()
            self._checkers, self._options = RowCheckers(wanted, task.options), task.options
        return self._checkers

    def close(self) -> None:
        if self._checkers is not None:
            self._checkers.close()
            self._checkers = None


class _SpanScan:
    """One span: judged block by block, in helper processes when there are some (their verdicts taken in order, a
    few blocks behind the reader), else here."""

    def __init__(self, number, span, task, schema, content, checkers):
        self.number, self.span, self.content, self.checkers = number, span, content, checkers
        self.limit = task.options.max_line_bytes
        self.rows = RowNormaliser(span.path, task.options, 0, schema, file_start=span.file_start)
        self.identical, self.longest = True, 0
        self.window: deque = deque()
        self.depth = pipeline_depth(checkers.processes) if checkers is not None else 0
        self.source = span.path if span.codec == "none" else None  # helpers pread plain files themselves

    def run(self) -> tuple[int, bool, int]:
        """(rows, every row kept byte for byte, longest line)."""
        span = self.span
        _unchanged(self.number, span, "before it was read")
        framer = LineFramer(self.limit, self._too_long)
        chunks = prefetch(lambda: read_span(span))
        try:
            for block in framer.blocks(chunks):
                if self.checkers is None:
                    self._serial(block)
                else:
                    self._submit(block)
            self._settle(0)
            if framer.tail is not None:
                if not span.file_end:  # a cut the plan placed at a line end is no longer one
                    raise _changed(self.number, "a planned cut is no longer at the end of a line")
                self.identical &= self.rows.lines([framer.tail]) is None
                self.longest = max(self.longest, len(framer.tail))
                self.content.add(framer.tail + b"\n")  # the content gives the file's last line its newline
        except InputError as exc:
            raise _refusal(self.number, _line_of(exc, span.path), exc) from None
        finally:
            chunks.close()
        _unchanged(self.number, span, "while it was read")
        return self.rows.rows, self.identical, self.longest

    def _serial(self, block: LineBlock) -> None:
        lines = block.lines()
        at = first_too_long(lines, self.limit, READ_BYTES)
        if at is not None:
            raise _refusal(self.number, self.rows.rows + at + 1, _too_long_error(self.limit))
        self.identical &= self.rows.lines(lines) is None  # None: every row kept byte for byte
        self.longest = max(self.longest, max(map(len, lines)))
        self.content.add(block.view())

    def _submit(self, block: LineBlock) -> None:
        self._settle(self.depth - 1)
        data = None if self.source is not None else memoryview(block.raw)[block.start : block.stop]
        offset = self.span.offset + block.offset
        self.window.append((self.checkers.check(self.source, offset, block.stop - block.start, data), block))

    def _settle(self, keep: int) -> None:
        while len(self.window) > keep:
            verdict, block = self.window.popleft()
            try:
                count, clean, block_schema = verdict.result()
            except Exception:  # noqa: BLE001 - a helper died: this block takes the serial path
                count, clean, block_schema = 0, False, None
            if not clean:
                self._serial(block)
                continue
            self.rows.schema.merge(block_schema)
            self.rows.rows += count
            self.longest = max(self.longest, max(map(len, block.lines())))
            self.content.add(block.view())

    def _too_long(self) -> NoReturn:
        self._settle(0)  # the long line is the next one after everything judged so far
        raise _refusal(self.number, self.rows.rows + 1, _too_long_error(self.limit))


def _unchanged(number: int, span: SourceSpan, when: str) -> None:
    what = span_change(span)
    if what is not None:
        raise _changed(number, f"the file is gone ({when})" if what == GONE else f"{when}: {what}")


def _changed(number: int, what: str) -> ScanRefused:
    hint = "stop whatever writes the input and prepare a new job_dir"
    return _refusal(number, None, InputChangedError(f"input changed since the job was planned ({what})", hint=hint))


def _refusal(number: int, line: int | None, exc: InputError | InputChangedError) -> ScanRefused:
    return ScanRefused(ScanRefusal(number, line, exc.message, exc.hint, type(exc).__name__))


def _too_long_error(limit: int) -> InputError:
    return InputError(
        f"line longer than {limit} bytes",
        hint="split huge rows, or raise elastic.max_line_bytes (memory use grows with it)",
    )


def _line_of(exc: InputError, display: str) -> int | None:
    """The span-relative line a row error names (``RowNormaliser`` words it ``<display>:<line>``)."""
    where = exc.where or ""
    head, _, tail = where.rpartition(":")
    return int(tail) if head == display and tail.isdigit() else None
