"""Reading one shard's rows from where they are: byte ranges of the input files, or a copy.

A shard is a list of spans (byte ranges of input files; a compressed file is one span,
decoded whole) or, with ``copy_shards``, a file in the job directory holding the same
*content*: the spans' decoded bytes, a newline added after a span that ends its file without
one.  Every read of a shard hashes that content as it goes and compares bytes and sha256
with the shard's scan at the end: an input changed after its scan is refused
(InputChangedError naming the file and what changed), never run.  Before reading, the files'
sizes and mtimes are compared with the plan (:func:`check_source`), so a changed file is
refused before anything is read when its metadata shows the change.

Rows that the scan found needing normalisation (relative media paths, a missing index key,
CRLF, a BOM, blanks around a row: ``rows.jsonl``) are normalised here, with the same
``RowNormaliser`` prepare used, so a row reaches operators exactly as the job defines it.
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
    """Refuse a shard whose input files changed since the plan, by their size and mtime (cheap:
    one stat per file); the content hash checked while reading catches the rest."""
    if source.copy is not None:
        return
    for span in source.spans:
        _check_unchanged(span, source)


GONE: Final = "gone"  # what span_change says of a file that no longer exists


def span_change(span: SourceSpan) -> str | None:
    """How the span's file differs from the plan by size and mtime (one stat): :data:`GONE`,
    ``"size A -> B, mtime_ns C -> D"``, or None when it looks unchanged."""
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
    """The shard's content in chunks, hashed on the way; InputChangedError at the end (before the
    last chunk is handed on) when bytes or sha256 differ from the scan's."""
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
    """The span's bytes as stored (a plain file's byte range), or decoded (a compressed file, whole).
    A file shorter than planned ends the chunks early: its size check refuses it."""
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
    """The shard's rows as lines without their newline, in order, normalised when the scan said so."""
    framer = LineFramer()
    spans = _NormalisingSpans(source) if source.options is not None else None
    for framed in framer.blocks(iter_content(source)):
        lines = framed.lines()
        yield from (lines if spans is None else spans.normalise(lines))
    if framer.tail is not None:  # only a changed input can leave one: the hash check has run by now
        raise _changed(source, "its last line lost its newline", source.display)


class _NormalisingSpans:
    """One ``RowNormaliser`` per span, switched after the span's rows (index keys count on)."""

    def __init__(self, source: ShardSource):
        assert source.options is not None
        self.source, self.options = source, source.options
        self.span = -1
        self.left = 0
        self.next_index = source.first_row
        self.normaliser: RowNormaliser | None = None

    def _advance(self) -> None:
        if self.span + 1 >= len(self.source.spans):  # more rows than scanned: only a changed input
            raise _changed(self.source, "it holds more rows than its scan found", self.source.display)
        self.span += 1
        span = self.source.spans[self.span]
        self.normaliser = RowNormaliser(
            span.path, self.options, self.next_index, RowSchema(), file_start=span.file_start
        )
        self.left = span.rows
        self.next_index += span.rows

    def normalise(self, lines: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        while lines:
            while self.left == 0:
                self._advance()
            take, lines = lines[: self.left], lines[self.left :]
            self.left -= len(take)
            normalised = self.normaliser.lines(take)
            out.extend(take if normalised is None else normalised)
        return out
