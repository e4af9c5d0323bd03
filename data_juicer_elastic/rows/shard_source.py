"""Reading one shard's rows from where they are (byte ranges of the input files, or a copy), its content hashed
and checked against its scan: a changed input is refused (InputChangedError), never run.  Content, zero-copy
and copied shards: docs/input-format.md, "Planning, scanning and reading shards".
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from data_juicer_elastic.errors import InputChangedError
from data_juicer_elastic.rows.codecs import READ_BYTES, iter_decoded
from data_juicer_elastic.rows.jsonl import NormaliseOptions, RowNormaliser
from data_juicer_elastic.rows.line_framer import LineFramer
from data_juicer_elastic.rows.row_schema import RowSchema
from data_juicer_elastic.sharedfs import fsio


@dataclass(frozen=True)
class SourceSpan:
    path: str
    offset: int
    length: int  # stored bytes (a compressed file: the whole file)
    codec: str
    size: int  # the file's size and mtime when the job was planned
    mtime_ns: int
    rows: int  # rows the scan found in the span

    @property
    def file_start(self) -> bool:
        return self.offset == 0

    @property
    def file_end(self) -> bool:
        return self.offset + self.length == self.size


@dataclass(frozen=True)
class ShardSource:
    """Where a shard's content is and what it must hash to (picklable: a Ray worker may read it)."""

    shard_id: str
    spans: tuple[SourceSpan, ...]
    bytes: int
    sha256: str
    first_row: int  # global index of the shard's first row (index_key)
    options: NormaliseOptions | None = None  # None: every row is read as it is
    copy: str | None = None  # a copy of the content in the job directory: read it instead of the spans
    copy_codec: str = "none"

    @property
    def where(self) -> str:
        return f"shard {self.shard_id}"

    @property
    def files(self) -> tuple[str, ...]:
        """The files the content is read from: its copy, or its input files (each once, in order)."""
        return (self.copy,) if self.copy is not None else tuple(dict.fromkeys(span.path for span in self.spans))

    @property
    def display(self) -> str:
        """The shard's location for messages: its copy, or its input files."""
        files = self.files
        return files[0] if len(files) == 1 else f"{files[0]} (+{len(files) - 1} more files)"


def check_source(source: ShardSource) -> None:
    """Refuse a shard whose input files changed since the plan, by size and mtime (one stat per file)."""
    if source.copy is not None:
        return
    for span in source.spans:
        _check_unchanged(span, source)


GONE: Final = "gone"  # what span_change says of a file that no longer exists


def span_change(span: SourceSpan) -> str | None:
    """How the span's file differs from the plan: :data:`GONE`, ``"size A -> B, mtime_ns C -> D"``, or None."""
    try:
        now = fsio.stat(Path(span.path))
    except FileNotFoundError:
        return GONE
    if (now.st_size, now.st_mtime_ns) != (span.size, span.mtime_ns):
        return f"size {span.size} -> {now.st_size}, mtime_ns {span.mtime_ns} -> {now.st_mtime_ns}"
    return None


def _check_unchanged(span: SourceSpan, source: ShardSource) -> None:
    what = span_change(span)
    if what is not None:
        raise _changed(source, f"{span.path} is gone" if what == GONE else what, span.path)


def _changed(source: ShardSource, what: str, path: str) -> InputChangedError:
    return InputChangedError(
        f"input changed since the job was planned and scanned ({what}); {source.where} is not run on changed data",
        where=path,
        hint="restore the input, or prepare a new job_dir for the changed input "
        "(elastic.copy_shards: true makes a job immune to later input changes)",
    )


def iter_content(source: ShardSource, block: int = READ_BYTES) -> Iterator[bytes]:
    """The shard's content in chunks, hashed on the way; InputChangedError at the end (before the last chunk is
    handed on) when bytes or sha256 differ from the scan's."""
    digest, size = hashlib.sha256(), 0
    if source.copy is not None:
        chunks = iter_decoded(Path(source.copy), source.copy_codec, block)
    else:
        chunks = _span_chunks(source, block)
    pending = b""
    for chunk in chunks:
        if pending:
            yield pending
        digest.update(chunk)
        size += len(chunk)
        pending = chunk
    if (size, digest.hexdigest()) != (source.bytes, source.sha256):
        for span in source.spans if source.copy is None else ():
            _check_unchanged(span, source)  # names the file whose metadata shows the change
        raise _changed(
            source,
            f"content of {source.bytes} bytes sha256 {source.sha256} when scanned, "
            f"{size} bytes sha256 {digest.hexdigest()} now",
            source.display,
        )
    if pending:
        yield pending


def _span_chunks(source: ShardSource, block: int) -> Iterator[bytes]:
    for span in source.spans:
        last = b""
        for chunk in read_span(span, block):
            if chunk:
                last = chunk[-1:]
                yield chunk
        if span.file_end and last not in (b"\n", b""):
            yield b"\n"  # the file's last line has no newline: the content gives it one


def read_span(span: SourceSpan, block: int = READ_BYTES) -> Iterator[bytes]:
    """The span's bytes as stored (a plain file's byte range), or decoded (a compressed file, whole).  A file
    shorter than planned ends the chunks early: its size check refuses it."""
    if span.codec != "none":
        yield from iter_decoded(Path(span.path), span.codec, block)
        return
    with fsio.open_read(Path(span.path)) as handle:
        handle.seek(span.offset)
        left = span.length
        while left > 0:
            chunk = handle.read(min(block, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk


def iter_source_lines(source: ShardSource) -> Iterator[bytes]:
    """The shard's rows as lines without their newline, in order, normalised when the scan said so: one
    ``RowNormaliser`` per span, switched after the span's rows (index keys count on)."""
    framer = LineFramer()
    spans, left, index, normaliser = iter(source.spans), 0, source.first_row, None
    for framed in framer.blocks(iter_content(source)):
        lines = framed.lines()
        if source.options is None:
            yield from lines
            continue
        out: list[bytes] = []
        while lines:
            while left == 0:
                span = next(spans, None)
                if span is None:  # more rows than scanned: only a changed input
                    raise _changed(source, "it holds more rows than its scan found", source.display)
                normaliser = RowNormaliser(span.path, source.options, index, RowSchema(), file_start=span.file_start)
                left, index = span.rows, index + span.rows
            take, lines = lines[:left], lines[left:]
            left -= len(take)
            normalised = normaliser.lines(take)
            out.extend(take if normalised is None else normalised)
        yield from out
    if framer.tail is not None:  # only a changed input can leave one: the hash check has run by now
        raise _changed(source, "its last line lost its newline", source.display)
