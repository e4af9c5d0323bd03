"""Whole lines out of a byte stream read in chunks: the one place a line spanning chunks is joined.

Every JSONL reader (scans, the shard reader, the output check) works on *blocks* of whole lines, cut the same way
and cheaply (scans run it over gigabytes): the whole lines inside one chunk are one block that *refers* to the
chunk (nothing copied); a line spanning chunks is joined once, into a block of its own; what follows the last
newline is :attr:`LineFramer.tail`, for the caller to judge.  With a ``limit``, a carried line that grows past it
is reported as soon as that is known, so memory stays about ``limit`` + a chunk.  The framer knows byte offsets;
line numbers are the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple, NoReturn


class LineBlock(NamedTuple):
    """``raw[start:stop]``: whole lines, each with its newline; ``offset``: where ``raw[start]`` is in the stream.
    ``start`` is 0 or just past ``raw``'s first newline and ``stop`` is just past its last one (what :meth:`lines`
    relies on)."""

    raw: bytes
    start: int
    stop: int
    offset: int

    def lines(self) -> list[bytes]:
        """The block's lines without their newlines (``raw`` split whole: the pieces outside the block are dropped)."""
        lines = self.raw.split(b"\n")
        lines.pop()  # after the last newline: the next line's start, or empty
        if self.start:
            del lines[0]  # before the first newline: the end of a line framed already
        return lines

    def view(self) -> bytes | memoryview:
        if self.start == 0 and self.stop == len(self.raw):
            return self.raw
        return memoryview(self.raw)[self.start : self.stop]


class LineFramer:
    """Frames one stream; ``too_long()`` (which must raise) is called when a line is known to be longer than
    ``limit`` bytes without its newline (lines inside one chunk are not measured here: the caller splits those
    anyway, see :func:`first_too_long`)."""

    def __init__(self, limit: int | None = None, too_long: Callable[[], NoReturn] | None = None):
        self.limit = limit
        self._too_long = too_long
        self.tail: bytes | None = None  # after the stream: a last line without its newline

    def blocks(self, chunks: Iterable[bytes]) -> Iterator[LineBlock]:
        limit = self.limit
        carry: list[bytes] = []
        carry_len = carry_at = pos = 0  # carry_at: stream offset where the carried line starts
        for chunk in chunks:
            nl = chunk.find(b"\n")
            if nl < 0:  # no newline in this chunk: the line goes on
                carry.append(chunk)
                carry_len += len(chunk)
                pos += len(chunk)
                if limit is not None and carry_len > limit:
                    self._report()
                continue
            start = 0
            if carry:  # the line that spans chunks is a block of its own: the chunk is never copied
                first = b"".join(carry) + chunk[: nl + 1]
                carry, carry_len = [], 0
                if limit is not None and len(first) - 1 > limit:
                    self._report()
                yield LineBlock(first, 0, len(first), carry_at)
                start = nl + 1
            cut = chunk.rfind(b"\n") + 1
            if cut > start:
                yield LineBlock(chunk, start, cut, pos + start)
            if cut < len(chunk):
                carry, carry_len, carry_at = [chunk[cut:]], len(chunk) - cut, pos + cut
                if limit is not None and carry_len > limit:
                    self._report()
            pos += len(chunk)
        self.tail = b"".join(carry) if carry else None

    def _report(self) -> NoReturn:
        assert self._too_long is not None, "a limit needs a too_long callback"
        self._too_long()


def first_too_long(lines: list[bytes], limit: int, chunk_bytes: int) -> int | None:
    """Index of the first line longer than ``limit`` among lines framed from chunks of at most ``chunk_bytes``
    (none can be when the limit is at least a chunk: the framer catches such a line while it is carried)."""
    if limit >= chunk_bytes or max(map(len, lines)) <= limit:
        return None
    return next(i for i, line in enumerate(lines) if len(line) > limit)
