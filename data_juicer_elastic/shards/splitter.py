"""Splitting normalised rows into exactly ``n`` contiguous, non-empty shards balanced by bytes.

The rule (one definition, two implementations that the tests hold equal):

* shard ``k`` (``k < n-1``) ends at the row boundary nearest its byte target
  ``T = total*(k+1)/n``; when both neighbours are equally near it ends before the
  row that straddles ``T``;
* a shard is never empty: its first row is always taken;
* with ``total_rows`` known, shard ``k`` ends at the latest after global row
  ``total_rows - (n-1-k)``, so every later shard still gets a row.

All comparisons are exact integer arithmetic (no float rounding at large sizes).
:class:`ShardSplitter` applies the rule row by row (the reference);
:class:`BlockSplitter` applies it to blocks of whole rows and touches individual
rows only around the ``n-1`` cut points, which is what makes prepare fast.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from data_juicer_elastic.errors import InputChangedError
from data_juicer_elastic.jobdir.layout import shard_id
from data_juicer_elastic.jobdir.records import ShardEntry
from data_juicer_elastic.sharedfs import checked_writer


def target_span(total_bytes: int, k: int, n: int) -> int:
    """Bytes between shard ``k``'s byte targets under the rule: what the shard will roughly hold
    (it ends at the row boundary nearest its target), e.g. to reserve its space up front."""
    return total_bytes * (k + 1) // n - total_bytes * k // n


class ShardSplitter:
    """The reference: streams rows one at a time into ``n`` shards under the rule above."""

    def __init__(self, out_dir: Path, n: int, total_rows: int, total_bytes: int):
        self.out_dir, self.n, self.total_rows, self.total_bytes = out_dir, n, total_rows, total_bytes
        self.k = 0
        self.cum = 0
        self.seen = 0
        self.entries: list[ShardEntry] = []
        self.content = hashlib.sha256()
        self._open()

    def _open(self) -> None:
        self.writer = checked_writer.BufferedCheckedWriter(self.out_dir / f"{shard_id(self.k, self.n)}.jsonl")
        self.digest = hashlib.sha256()
        self.rows = self.bytes = 0
        self.first_row = self.seen

    def _close(self) -> None:
        self.writer.finish()
        entry = ShardEntry(
            shard_id(self.k, self.n), self.k, self.first_row, self.rows, self.bytes, self.digest.hexdigest()
        )
        self.entries.append(entry)

    def add(self, row: bytes) -> None:
        size = len(row)
        if self.rows and self.k < self.n - 1:
            t = self.total_bytes * (self.k + 1)  # the target times n
            must_close = self.total_rows - self.seen == self.n - 1 - self.k
            nearer = self.n * (self.cum + size) > t and 2 * t <= self.n * (2 * self.cum + size)
            if must_close or nearer:
                self._close()
                self.k += 1
                self._open()
        self.writer.write(row)
        self.digest.update(row)
        self.content.update(row)
        self.rows += 1
        self.bytes += size
        self.cum += size
        self.seen += 1

    def finish(self) -> list[ShardEntry]:
        self._close()
        if len(self.entries) != self.n or self.seen != self.total_rows:  # pragma: no cover - guarded by pass 1
            raise InputChangedError(f"expected {self.total_rows} rows in {self.n} shards, wrote {self.seen}")
        return self.entries

    def abort(self) -> None:
        self.writer.abort()


class PieceWriter(Protocol):
    def write(self, data: bytes | memoryview, rows: int) -> None: ...
    def finish(self) -> Any: ...  # (sha, stored bytes, stored sha), or a list holding it later
    def abort(self) -> None: ...


@dataclass(frozen=True)
class Piece:
    """One finished shard (or speculative piece) as the splitter cut it."""

    index: int
    first_row: int
    rows: int
    bytes: int  # normalised content bytes
    sha256: str  # of the content
    stored_bytes: int  # of the file as written (== bytes without a codec)
    stored_sha256: str


class BlockSplitter:
    """Applies the rule to a stream of blocks, each holding whole rows (ending with a newline).

    ``open_piece(k)`` returns the writer of shard ``k``.  ``total_rows=None`` drops the
    row cap (prepare's speculative first pass, which checks afterwards that it did not
    bind: :meth:`cap_respected`).
    """

    def __init__(
        self, n: int, total_bytes: int, total_rows: int | None, open_piece, content_digest: bool = False, io=None
    ):
        self.n, self.total, self.total_rows = n, total_bytes, total_rows
        self._open_piece = open_piece
        self._io = io  # a codecs.BackgroundIO running the writers' hashing and writing, or None
        self.content = hashlib.sha256() if content_digest else None
        self.pieces: list[Piece] = []
        self._pending: list[tuple[int, int, int, int, Any]] = []
        self.k = 0
        self.pos = 0  # stream offset of the next byte to arrive
        self.rows_done = 0  # rows handed to writers so far
        self._start = 0  # stream offset where shard k starts
        self._start_row = 0
        self._first_end: int | None = None  # where shard k's first row ends, once seen
        self._bytes = 0
        self._writer: PieceWriter = open_piece(0)

    def add(self, block: bytes, start: int = 0, stop: int | None = None, rows: int | None = None) -> None:
        """Append ``block[start:stop]`` (whole rows; ``rows`` of them if the caller knows) to the stream."""
        stop = len(block) if stop is None else stop
        if stop <= start:
            return
        base = self.pos - start  # stream offset of block[0]
        done = start
        while self.k < self.n - 1:
            cut = self._boundary(block, base, done, stop)
            if cut is None:
                break
            self._write(block, done, cut - base)
            done = cut - base
            self._next_piece(cut)
            rows = None  # the count given was for the whole block
        self._write(block, done, stop, rows)
        self.pos = base + stop

    def _write(self, block: bytes, a: int, b: int, rows: int | None = None) -> None:
        if b <= a:
            return
        if rows is None:
            rows = block.count(b"\n", a, b)
        view = memoryview(block)[a:b]
        self._writer.write(view, rows)
        if self.content is not None:
            if self._io is not None:
                self._io.submit(self.content.update, view)
            else:
                self.content.update(view)
        self.rows_done += rows
        self._bytes += b - a

    def _boundary(self, block: bytes, base: int, done: int, stop: int) -> int | None:
        """Stream offset where shard k ends if that is inside ``block[done:stop]``, else None."""
        if self._first_end is None:
            if self._start >= base + stop:
                return None
            self._first_end = base + block.index(b"\n", self._start - base, stop) + 1
        first_end = self._first_end
        cut = None
        t = self.total * (self.k + 1)  # the target times n
        if self.n * first_end > t:
            cut = first_end  # the target lies within (or before) the shard's first row
        else:
            f = t // self.n  # the byte the target falls in
            if f < base + stop:
                # done is a row start at or before f: the row holding f starts after the last newline.
                rs = base + max(block.rfind(b"\n", done, f - base) + 1, done)
                re = base + block.index(b"\n", f - base, stop) + 1
                cut = rs if 2 * t <= self.n * (rs + re) else re
        if self.total_rows is not None:
            cap = self._row_cap(block, base, done, stop)
            if cap is not None and (cut is None or cap < cut):
                cut = cap
        return cut

    def _row_cap(self, block: bytes, base: int, done: int, stop: int) -> int | None:
        assert self.total_rows is not None
        allowed = self.total_rows - (self.n - 1 - self.k) - self.rows_done  # rows still allowed from `done`
        if allowed <= 0 or block.count(b"\n", done, stop) < allowed:
            return None
        at = done
        for _ in range(allowed):  # only reached when shards are a few rows each
            at = block.index(b"\n", at, stop) + 1
        return base + at

    def _next_piece(self, cut: int) -> None:
        self._finish_piece()
        self.k += 1
        self._start, self._start_row, self._first_end, self._bytes = cut, self.rows_done, None, 0
        self._writer = self._open_piece(self.k)

    def _finish_piece(self) -> None:
        result = self._writer.finish()  # a tuple, or a box filled by the background writer
        self._pending.append((self.k, self._start_row, self.rows_done - self._start_row, self._bytes, result))

    def finish(self) -> list[Piece]:
        """Close the last piece; the pieces cut so far (fewer than n when the stream ran short)."""
        self._finish_piece()
        if self._io is not None:
            self._io.drain()
        for k, first_row, rows, size, result in self._pending:
            sha, stored_bytes, stored_sha = result[0] if isinstance(result, list) else result
            self.pieces.append(Piece(k, first_row, rows, size, sha, stored_bytes, stored_sha))
        return self.pieces

    def abort(self) -> None:
        self._writer.abort()

    def cap_respected(self, total_rows: int) -> bool:
        """Whether the row cap (unknown during the pass) would have left every cut where it is."""
        through = 0
        for piece in self.pieces[:-1]:
            through += piece.rows
            if through > total_rows - (self.n - 1 - piece.index):
                return False
        return True
