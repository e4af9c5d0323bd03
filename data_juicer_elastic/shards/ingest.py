"""Prepare's passes over the input: one read that validates, normalises and (usually) shards.

Pass A reads every input once: a reader thread reads, hashes the stored bytes and
decompresses; the rows are validated (``jsonl``; in helper processes for large inputs,
``row_checkers``) and the normalised rows stream into *pieces* cut by the splitter
rule with a guessed total: the sum of the input sizes, or for compressed inputs the
decoded size their own headers give (``codecs.decoded_size_hint``).  When rows need no
change (the common case) and the hint was right, that guess is the exact total, and
the pieces already are the shards: no second read, no second parse.

Pass B runs otherwise (rows changed size, no or a wrong size hint, a shard codec, or
the row cap would have moved a cut): it streams the pieces once more, without parsing,
through the splitter with the true totals, writing the final shards.  Either way
the shards, their hashes and the manifest are exactly what the rule gives for the
normalised rows, so the two paths cannot be told apart.

Inputs are read once, so "changed between passes" cannot happen; a change *during*
the read is caught by comparing size and mtime before and after, and the size with
the bytes actually read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from data_juicer_elastic.errors import InputChangedError, InputError
from data_juicer_elastic.jobdir.layout import shard_id
from data_juicer_elastic.jobdir.records import InputFile, ShardEntry
from data_juicer_elastic.rows.codecs import (
    READ_BYTES,
    SHARD_SUFFIX,
    AsyncShardWriter,
    BackgroundIO,
    Codec,
    RawStats,
    ShardFileWriter,
    Syncer,
    decoded_size_hint,
    iter_decoded,
    prefetch,
)
from data_juicer_elastic.rows.jsonl import NormaliseOptions, RowNormaliser
from data_juicer_elastic.rows.line_framer import LineBlock, LineFramer, first_too_long, whole_line_blocks
from data_juicer_elastic.rows.row_checkers import RowCheckers, default_processes, pipeline_depth
from data_juicer_elastic.rows.row_schema import RowSchema
from data_juicer_elastic.shards import steps
from data_juicer_elastic.shards.splitter import BlockSplitter, Piece, target_span
from data_juicer_elastic.sharedfs import fsio

_VALIDATING = "prepare: validating input"


@dataclass(frozen=True)
class InputItem:
    path: Path  # absolute
    relpath: str  # POSIX, relative to the dataset root (file name for one file)
    codec: Codec


@dataclass(frozen=True)
class Ingested:
    inputs: list[InputFile]
    total_rows: int
    total_bytes: int
    content_sha256: str
    shards: list[ShardEntry]
    passes: int  # 1 when the first pass's pieces were the shards
    schema: RowSchema  # the JSON types of every row (row_schema)


def ingest(
    inputs: list[InputItem],
    options: NormaliseOptions,
    work: Path,
    out_dir: Path,
    n: int,
    codec: Codec,
    processes: int | None = None,
) -> Ingested | None:
    """Validate, normalise and split ``inputs``; the shards land in ``out_dir``.

    Returns None when the input holds no rows (nothing is written then).
    ``work`` is a private scratch directory on the job's filesystem.
    """
    sizes = [fsio.stat(i.path).st_size for i in inputs]
    input_bytes = sum(sizes)
    hints = [decoded_size_hint(i.path, i.codec, size) for i, size in zip(inputs, sizes, strict=True)]
    # The decoded total, when every input tells it: then the first pass can cut the final shards.
    guess = sum(hints) if None not in hints else None  # type: ignore[arg-type]
    if processes is None:  # compressed inputs decode to more bytes than they store
        processes = default_processes(guess or 4 * input_bytes)
    pieces_dir = work / "pieces"
    fsio.makedirs(pieces_dir)

    io, syncer = BackgroundIO(), Syncer()

    def open_piece(k: int) -> AsyncShardWriter:
        expected = target_span(guess, k, n) if guess else 0
        return AsyncShardWriter(ShardFileWriter(pieces_dir / f"{k:05d}.jsonl", "none", expected), io, syncer)

    # Without a usable guess everything goes into one piece (n=1 never cuts).
    # The content sha256 is the first input's own unless there are several inputs or it is decoded.
    digest_content = len(inputs) > 1 or inputs[0].codec != "none"
    splitter = BlockSplitter(n if guess else 1, guess or 1, None, open_piece, content_digest=digest_content, io=io)
    try:
        checkers = RowCheckers(processes, options) if processes else None
        try:
            fingerprints, identical, schema = _pass_a(inputs, options, splitter, input_bytes, checkers)
        finally:
            if checkers is not None:
                checkers.close()
        pieces = splitter.finish()
        syncer.wait()  # the pieces may become the shards: durable before the manifest names them
    except BaseException:
        splitter.abort()
        raise
    finally:
        io.close()
        syncer.close()
    total_rows = sum(f.rows for f in fingerprints)
    total_bytes = splitter.pos
    if total_rows == 0:
        return None
    if n > total_rows:
        return Ingested(fingerprints, total_rows, total_bytes, "", [], 1, schema)
    content = splitter.content.hexdigest() if splitter.content is not None else None
    if content is None and identical:
        content = fingerprints[0].sha256  # the normalised stream is the file, byte for byte
    final = guess == total_bytes and len(pieces) == n and splitter.cap_respected(total_rows) and content is not None
    if final and codec == "none":
        for piece in pieces:
            fsio.move(pieces_dir / f"{piece.index:05d}.jsonl", out_dir / f"{shard_id(piece.index, n)}.jsonl")
        passes = 1
        steps.report("prepare: writing shards", input_bytes, input_bytes)  # written during the one read
    else:
        pieces, content = _pass_b(
            [pieces_dir / f"{p.index:05d}.jsonl" for p in pieces], n, total_bytes, total_rows, out_dir, codec
        )
        passes = 2
    shards = [_entry(p, n, codec) for p in pieces]
    return Ingested(fingerprints, total_rows, total_bytes, content, shards, passes, schema)


def _entry(piece: Piece, n: int, codec: Codec) -> ShardEntry:
    stored = {} if codec == "none" else {"stored_bytes": piece.stored_bytes, "stored_sha256": piece.stored_sha256}
    sid = shard_id(piece.index, n)
    return ShardEntry(sid, piece.index, piece.first_row, piece.rows, piece.bytes, piece.sha256, **stored)


# -- pass A -----------------------------------------------------------------------------------
def _pass_a(
    inputs: list[InputItem],
    options: NormaliseOptions,
    splitter: BlockSplitter,
    input_bytes: int,
    checkers: RowCheckers | None,
) -> tuple[list[InputFile], bool, RowSchema]:
    fingerprints: list[InputFile] = []
    schema = RowSchema()
    identical = len(inputs) == 1 and inputs[0].codec == "none"
    first_index = read_before = 0
    for item in inputs:
        display = str(item.path)
        before = fsio.stat(item.path)
        stats = RawStats()
        rows = RowNormaliser(display, options, first_index, schema)
        chunks = prefetch(lambda item=item, stats=stats: iter_decoded(item.path, item.codec, stats))
        try:
            if checkers is not None:
                source = str(item.path) if item.codec == "none" else None  # the children pread plain files
                feed = _ParallelFeed(checkers, source, rows, splitter, options.max_line_bytes, display)
                done = read_before
                identical &= feed.run(chunks, lambda: steps.report(_VALIDATING, done + stats.size, input_bytes))  # noqa: B023 - called only in this iteration
            else:
                for lines, raw, start, stop in _line_blocks(chunks, options.max_line_bytes, display):
                    steps.report(_VALIDATING, read_before + stats.size, input_bytes)  # per block
                    identical &= _add_lines(rows, splitter, lines, raw, start, stop)
        finally:
            chunks.close()
        after = fsio.stat(item.path)
        if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or stats.size != after.st_size:
            raise _changed(item.path, stats, before.st_size, after.st_size)
        fingerprints.append(InputFile(display, item.relpath, stats.sha256, after.st_size, after.st_mtime_ns, rows.rows))
        read_before += stats.size
        steps.report(_VALIDATING, read_before, input_bytes)
        first_index += rows.rows
    return fingerprints, identical, schema


def _add_lines(
    rows: RowNormaliser, splitter: BlockSplitter, lines: list[bytes], raw: bytes | None, start: int, stop: int
) -> bool:
    """Validate ``lines`` serially and stream them on; True when they went on byte for byte.
    ``raw[start:stop]`` is the lines as read (``raw`` None: a last line without its newline)."""
    out = rows.lines(lines)
    if out is None and raw is not None:
        splitter.add(raw, start, stop, rows=len(lines))
        return True
    splitter.add(b"\n".join(out if out is not None else lines) + b"\n")
    return False


class _ParallelFeed:
    """Pass A's loop with the row checks in helper processes (:mod:`row_checkers`).

    Blocks of whole lines go to the checkers as they are read; their verdicts are taken in
    order, at most ``window`` blocks behind the reader: a clean block streams on as read
    (its row schema, observed by the checker, joined into the job's in block order), any
    other block takes the serial path (:func:`_add_lines`), which words the error with
    its file:line or normalises the rows.  Line numbers count only settled blocks, so
    everything before a reported line has been judged.
    """

    def __init__(self, checkers, source, rows, splitter, limit: int, display: str):
        self.checkers, self.source, self.rows, self.splitter = checkers, source, rows, splitter
        self.limit, self.display = limit, display
        self.window: deque = deque()
        self.depth = pipeline_depth(checkers.processes)
        self.identical = True

    def run(self, chunks: Iterator[bytes], progress) -> bool:
        framer = LineFramer(self.limit, self._too_long)
        for block in framer.blocks(chunks):
            progress()
            self._submit(block)
        self._settle(0)
        if framer.tail is not None:  # a last line without its newline: serial (it gains one)
            self.identical &= _add_lines(self.rows, self.splitter, [framer.tail], None, 0, 0)
        return self.identical

    def _submit(self, block: LineBlock) -> None:
        self._settle(self.depth - 1)
        data = None if self.source is not None else memoryview(block.raw)[block.start : block.stop]
        self.window.append((self.checkers.check(self.source, block.offset, block.stop - block.start, data), block))

    def _settle(self, keep: int) -> None:
        while len(self.window) > keep:
            verdict, block = self.window.popleft()
            try:
                count, clean, block_schema = verdict.result()
            except Exception:  # noqa: BLE001 - a checker died: this block takes the serial path
                count, clean, block_schema = 0, False, None
            if clean:
                self.rows.schema.merge(block_schema)
                self.rows.rows += count
                self.splitter.add(block.raw, block.start, block.stop, rows=count)
                continue
            lines = block.lines()
            at = first_too_long(lines, self.limit, READ_BYTES)
            if at is not None:
                raise _too_long(self.limit, f"{self.display}:{self.rows.rows + at + 1}")
            self.identical &= _add_lines(self.rows, self.splitter, lines, block.raw, block.start, block.stop)

    def _too_long(self) -> NoReturn:
        self._settle(0)  # the long line is the next one after everything judged so far
        raise _too_long(self.limit, f"{self.display}:{self.rows.rows + 1}")


def _too_long(limit: int, where: str) -> InputError:
    return InputError(
        f"line longer than {limit} bytes",
        where=where,
        hint="split huge rows, or raise elastic.max_line_bytes (memory use grows with it)",
    )


def _changed(path: Path, stats: RawStats, size_before: int, size_after: int) -> InputChangedError:
    try:
        now = fsio.file_sha256(path)[1]
    except OSError as exc:
        now = f"unreadable ({exc.strerror})"
    return InputChangedError(
        f"input changed while prepare read it: sha256 {stats.sha256} (as read, {stats.size} bytes) -> {now} "
        f"(size {size_before} -> {size_after})",
        where=str(path),
        hint="stop whatever writes the input and prepare again",
    )


def _line_blocks(
    chunks: Iterator[bytes], limit: int, display: str
) -> Iterator[tuple[list[bytes], bytes | None, int, int]]:
    """(lines, raw, start, stop): ``raw[start:stop]`` is the lines with their newlines, as read;
    ``raw`` is None for a last line without a newline.  A line over ``limit`` bytes is an
    InputError as soon as it is known to be too long (memory stays ~ limit + a block)."""
    lineno = 0  # lines handed on so far

    def too_long() -> NoReturn:
        raise _too_long(limit, f"{display}:{lineno + 1}")

    framer = LineFramer(limit, too_long)
    for block in framer.blocks(chunks):
        lines = block.lines()
        at = first_too_long(lines, limit, READ_BYTES)
        if at is not None:
            raise _too_long(limit, f"{display}:{lineno + 1 + at}")
        yield lines, block.raw, block.start, block.stop
        lineno += len(lines)
    if framer.tail is not None:
        yield [framer.tail], None, 0, 0


# -- pass B -----------------------------------------------------------------------------------
def _pass_b(
    pieces: list[Path], n: int, total_bytes: int, total_rows: int, out_dir: Path, codec: Codec
) -> tuple[list[Piece], str]:
    io, syncer = BackgroundIO(), Syncer()

    def open_shard(k: int) -> AsyncShardWriter:
        path = out_dir / f"{shard_id(k, n)}{SHARD_SUFFIX[codec]}"
        return AsyncShardWriter(ShardFileWriter(path, codec, target_span(total_bytes, k, n)), io, syncer)

    splitter = BlockSplitter(n, total_bytes, total_rows, open_shard, content_digest=True, io=io)
    try:
        for path in pieces:
            blocks = prefetch(lambda path=path: whole_line_blocks(fsio.iter_chunks(path, READ_BYTES), str(path)))
            try:
                for block in blocks:
                    splitter.add(block.raw, block.start, block.stop)
                    steps.report("prepare: writing shards", splitter.pos, total_bytes)  # normalised bytes
            finally:
                blocks.close()
            fsio.remove(path)  # give the space back as we go
        result = splitter.finish()
        syncer.wait()
    except BaseException:
        splitter.abort()
        raise
    finally:
        io.close()
        syncer.close()
    if len(result) != n or splitter.pos != total_bytes or splitter.rows_done != total_rows:
        raise InputChangedError(  # pragma: no cover - the pieces are private to this prepare
            f"expected {total_rows} rows / {total_bytes} bytes in {n} shards, cut {len(result)} shards",
            where=str(out_dir),
        )
    assert splitter.content is not None
    return result, splitter.content.hexdigest()
