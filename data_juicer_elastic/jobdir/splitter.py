"""Streaming split of normalised rows into exactly ``n`` contiguous, non-empty shards."""

from __future__ import annotations

import hashlib
from pathlib import Path

from data_juicer_elastic.errors import InputChangedError
from data_juicer_elastic.jobdir import fsio
from data_juicer_elastic.jobdir.layout import shard_id
from data_juicer_elastic.jobdir.records import ShardEntry


class ShardSplitter:
    """Streams rows into ``n`` contiguous non-empty shards balanced by bytes.

    A shard ends at the row boundary nearest its byte target ``total*(k+1)/n``,
    and is forced to end when the remaining rows are exactly enough to give each
    remaining shard one row.  Deterministic: depends only on the row sizes.
    """

    def __init__(self, out_dir: Path, n: int, total_rows: int, total_bytes: int):
        self.out_dir, self.n, self.total_rows, self.total_bytes = out_dir, n, total_rows, total_bytes
        self.k = 0
        self.cum = 0
        self.seen = 0
        self.entries: list[ShardEntry] = []
        self.content = hashlib.sha256()
        self._open()

    def _open(self) -> None:
        self.writer = fsio.BufferedCheckedWriter(self.out_dir / f"{shard_id(self.k, self.n)}.jsonl")
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
            target = self.total_bytes * (self.k + 1) / self.n
            must_close = self.total_rows - self.seen == self.n - 1 - self.k
            nearer = self.cum + size > target and (target - self.cum) <= (self.cum + size - target)
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
