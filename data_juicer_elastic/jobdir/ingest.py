"""Prepare's passes over the input: one read that validates, normalises and (usually) shards.

Pass A reads every input once: a reader thread reads, hashes the stored bytes and
decompresses; this thread splits lines, validates every row (``jsonl``) and streams
the normalised rows into *pieces* cut by the splitter rule with a guessed total:
the sum of the input sizes.  For uncompressed inputs whose rows need no change
(the common case) that guess is the exact total, and the pieces already are the
shards: no second read, no second parse.

Pass B runs otherwise (rows changed size, compressed input, a shard codec, or the
row cap would have moved a cut): it streams the pieces once more, without parsing,
through the splitter with the true totals, writing the final shards.  Either way
the shards, their hashes and the manifest are exactly what the rule gives for the
normalised rows, so the two paths cannot be told apart.

Inputs are read once, so "changed between passes" cannot happen; a change *during*
the read is caught by comparing size and mtime before and after, and the size with
the bytes actually read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from data_juicer_elastic.errors import InputChangedError, InputError
from data_juicer_elastic.jobdir import fsio, steps
from data_juicer_elastic.jobdir.codecs import (
    READ_BYTES,
    SHARD_SUFFIX,
    AsyncShardWriter,
    BackgroundIO,
    Codec,
    RawStats,
    ShardFileWriter,
    Syncer,
    iter_decoded,
    prefetch,
)
from data_juicer_elastic.jobdir.jsonl import NormaliseOptions, RowNormaliser
from data_juicer_elastic.jobdir.layout import shard_id
from data_juicer_elastic.jobdir.records import InputFile, ShardEntry
from data_juicer_elastic.jobdir.splitter import BlockSplitter, Piece


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


def ingest(
    inputs: list[InputItem], options: NormaliseOptions, work: Path, out_dir: Path, n: int, codec: Codec
) -> Ingested | None:
    """Validate, normalise and split ``inputs``; the shards land in ``out_dir``.

    Returns None when the input holds no rows (nothing is written then).
    ``work`` is a private scratch directory on the job's filesystem.
    """
    input_bytes = sum(fsio.stat(i.path).st_size for i in inputs)
    guess = input_bytes if all(i.codec == "none" for i in inputs) else None
    pieces_dir = work / "pieces"
    fsio.makedirs(pieces_dir)

    io, syncer = BackgroundIO(), Syncer()

    def open_piece(k: int) -> AsyncShardWriter:
        return AsyncShardWriter(ShardFileWriter(pieces_dir / f"{k:05d}.jsonl", "none"), io, syncer)

    # Without a usable guess everything goes into one piece (n=1 never cuts).
    splitter = BlockSplitter(n if guess else 1, guess or 1, None, open_piece, content_digest=len(inputs) > 1, io=io)
    try:
        fingerprints, identical = _pass_a(inputs, options, splitter, input_bytes)
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
        return Ingested(fingerprints, total_rows, total_bytes, "", [], 1)
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
    return Ingested(fingerprints, total_rows, total_bytes, content, shards, passes)


def _entry(piece: Piece, n: int, codec: Codec) -> ShardEntry:
    stored = {} if codec == "none" else {"stored_bytes": piece.stored_bytes, "stored_sha256": piece.stored_sha256}
    sid = shard_id(piece.index, n)
    return ShardEntry(sid, piece.index, piece.first_row, piece.rows, piece.bytes, piece.sha256, **stored)


# -- pass A -----------------------------------------------------------------------------------
def _pass_a(
    inputs: list[InputItem], options: NormaliseOptions, splitter: BlockSplitter, input_bytes: int
) -> tuple[list[InputFile], bool]:
    fingerprints: list[InputFile] = []
    identical = len(inputs) == 1 and inputs[0].codec == "none"
    first_index = read_before = 0
    for item in inputs:
        display = str(item.path)
        before = fsio.stat(item.path)
        stats = RawStats()
        rows = RowNormaliser(display, options, first_index)
        chunks = prefetch(lambda item=item, stats=stats: iter_decoded(item.path, item.codec, stats))
        try:
            for lines, raw, start, stop in _line_blocks(chunks, options.max_line_bytes, display):
                steps.report("prepare: validating input", read_before + stats.size, input_bytes)  # per block
                out = rows.lines(lines, (raw, start, stop) if raw is not None else None)
                if out is None and raw is not None:
                    splitter.add(raw, start, stop, rows=len(lines))
                else:
                    identical = False
                    splitter.add(b"\n".join(out if out is not None else lines) + b"\n")
        finally:
            chunks.close()
        after = fsio.stat(item.path)
        if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or stats.size != after.st_size:
            raise _changed(item.path, stats, before.st_size, after.st_size)
        fingerprints.append(InputFile(display, item.relpath, stats.sha256, after.st_size, after.st_mtime_ns, rows.rows))
        read_before += stats.size
        steps.report("prepare: validating input", read_before, input_bytes)
        first_index += rows.rows
    return fingerprints, identical


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
    carry: list[bytes] = []
    carry_len = lineno = 0

    def too_long(line_number: int) -> InputError:
        return InputError(
            f"line longer than {limit} bytes",
            where=f"{display}:{line_number}",
            hint="split huge rows, or raise elastic.max_line_bytes (memory use grows with it)",
        )

    for chunk in chunks:
        parts = chunk.split(b"\n")
        tail = parts.pop()
        if not parts:  # no newline in this chunk: the line goes on
            carry.append(tail)
            carry_len += len(tail)
            if carry_len > limit:
                raise too_long(lineno + 1)
            continue
        start = 0
        if carry:
            carry.append(parts[0])
            first = b"".join(carry)
            carry, carry_len = [], 0
            if len(first) > limit:
                raise too_long(lineno + 1)
            lineno += 1
            yield [first], first + b"\n", 0, len(first) + 1
            start = len(parts[0]) + 1
            parts = parts[1:]
        if parts:
            if limit < READ_BYTES and max(map(len, parts)) > limit:
                raise too_long(lineno + 1 + next(i for i, p in enumerate(parts) if len(p) > limit))
            yield parts, chunk, start, len(chunk) - len(tail)
            lineno += len(parts)
        if tail:
            carry, carry_len = [tail], len(tail)
            if carry_len > limit:
                raise too_long(lineno + 1)
    if carry:
        last = b"".join(carry)
        yield [last], None, 0, 0


# -- pass B -----------------------------------------------------------------------------------
def _pass_b(
    pieces: list[Path], n: int, total_bytes: int, total_rows: int, out_dir: Path, codec: Codec
) -> tuple[list[Piece], str]:
    io, syncer = BackgroundIO(), Syncer()

    def open_shard(k: int) -> AsyncShardWriter:
        path = out_dir / f"{shard_id(k, n)}{SHARD_SUFFIX[codec]}"
        return AsyncShardWriter(ShardFileWriter(path, codec), io, syncer)

    splitter = BlockSplitter(n, total_bytes, total_rows, open_shard, content_digest=True, io=io)
    try:
        for path in pieces:
            chunks = prefetch(lambda path=path: _whole_rows(path))
            try:
                for chunk in chunks:
                    splitter.add(chunk)
                    steps.report("prepare: writing shards", splitter.pos, total_bytes)  # normalised bytes
            finally:
                chunks.close()
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


def _whole_rows(path: Path) -> Iterator[bytes]:
    """A piece's bytes in blocks that end at a newline (pieces always end with one)."""
    carry = b""
    for chunk in fsio.iter_chunks(path, READ_BYTES):
        block = carry + chunk if carry else chunk
        cut = block.rfind(b"\n") + 1
        if cut == len(block):
            carry = b""
            yield block
        elif cut:
            carry = block[cut:]
            yield block[:cut]
        else:
            carry = block
    if carry:  # pragma: no cover - pieces are written by pass A with a newline after every row
        raise InputChangedError("a staged piece does not end with a newline", where=str(path))
