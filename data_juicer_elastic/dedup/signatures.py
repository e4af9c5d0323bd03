"""One shard's signature file: every row that reached the stage's deduplicator, as (key, key2, global
row id) per band; the global id carries the row's input row number within the shard (``dedup.keys``).

Written once per shard after the operators before the deduplicator ran and its ``compute_hash`` filled
the hash column (``dedup.keys`` turns that column into keys).  One section per band, sorted by
(key, key2, row): a bucket task reads its key range of one band from every shard's file through the
table's block index (``tables.TableReader.read``).  Memory: the shard's keys and entries,
``rows * bands * (16 + 24)`` bytes, bounded by the shard, not the job.

The file is refused (``errors.IntegrityError``) when truncated, tampered with, or written for another
``identity`` (the recipe stage: a signature left by a different recipe is never read as this one's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from data_juicer_elastic.dedup import keys as dedup_keys
from data_juicer_elastic.dedup.tables import HEAD_READ, TableReader, publish_table
from data_juicer_elastic.errors import IntegrityError

KIND: Final = "dedup-signatures"
# Entries per checked block (96 KiB): a bucket task reads a band's key range from every shard, a few
# thousand entries per shard at 1e5 rows a shard and 64 ranges a band, so small blocks keep the bytes
# read close to the bytes used (one block of slack at each end of the range).
BLOCK_ENTRIES: Final = 4096
# The first read of a bucket group's reader: the header and every band's index (25 bands of 10^5 rows:
# ~90 KB), in one read.
GROUP_HEAD_READ: Final = 128 * 1024
FIELDS: Final = ("key", "key2", "row")


def band_name(band: int) -> str:
    return f"band-{band:04d}"


def signature_sections(keys: np.ndarray, shard: int, rows: np.ndarray, input_rows: int) -> list[tuple[str, np.ndarray]]:
    """The sorted sections of a shard whose stage rows ``rows`` (input row numbers, increasing) have
    ``keys`` of shape ``(len(rows), bands, 2)``."""
    count, bands, _ = keys.shape
    ids = dedup_keys.global_ids(shard, rows, input_rows)
    sections = []
    for band in range(bands):
        entries = np.empty(count, dtype=[(name, "<u8") for name in FIELDS])
        entries["key"], entries["key2"], entries["row"] = keys[:, band, 0], keys[:, band, 1], ids
        sections.append((band_name(band), entries[np.lexsort((ids, keys[:, band, 1], keys[:, band, 0]))]))
    return sections


@dataclass(frozen=True)
class ShardSignatures:
    shard: int
    rows: int  # rows that reached the stage
    bands: int
    path: Path
    input_rows: int  # the shard's input rows


def publish_signatures(
    path: Path,
    *,
    identity: str,
    shard: int,
    keys: np.ndarray,
    rows: np.ndarray,
    input_rows: int,
    method: str,
    params: dict | None = None,
    block_entries: int = BLOCK_ENTRIES,
    failed: np.ndarray | None = None,
    errors: str | None = None,
    errors_digest: dict | None = None,
) -> ShardSignatures:
    """Publish a shard's signature file (``tables.publish_table``: the first valid one wins; one refused
    is replaced).  ``rows``: the input row numbers (within the shard, strictly increasing) of the rows
    that reached the deduplicator, one per row of ``keys``; ``input_rows``: the shard's input rows;
    ``failed``: the input row numbers that reached it but whose ``compute_hash`` raised (quarantined, in
    ``errors``, the attempt's quarantine file relative to the job, its lines, bytes and sha256 in
    ``errors_digest``: ``dedup.hash_quarantine``): the stage drops them too."""
    keys = np.asarray(keys, dtype=np.uint64)
    rows = np.asarray(rows, dtype=np.uint64)
    if keys.ndim != 3 or keys.shape[2] != 2 or keys.shape[0] != len(rows):
        raise ValueError(f"keys must have shape ({len(rows)} rows, bands, 2), not {keys.shape}")
    count, bands, _ = keys.shape
    failed = np.unique(np.asarray(failed if failed is not None else [], dtype=np.uint64))
    if len(failed) and (int(failed[-1]) >= input_rows or np.isin(failed, rows).any()):
        raise ValueError(f"shard {shard}: failed rows must be input rows ({input_rows}) without keys")
    meta = {
        "shard": shard, "rows": count, "input_rows": input_rows, "bands": bands, "method": method,
        "params": params or {}, "failed": [int(row) for row in failed], "errors": errors,
        "errors_digest": errors_digest,
    }  # fmt: skip
    sections = signature_sections(keys, shard, rows, input_rows)
    found = publish_table(
        path, kind=KIND, identity=identity, fields=FIELDS, sections=sections, meta=meta, block_entries=block_entries
    )
    mine = (shard, count, input_rows, bands)
    if tuple(found.meta.get(name) for name in ("shard", "rows", "input_rows", "bands")) != mine:
        raise IntegrityError(
            f"holds shard {found.meta['shard']} ({found.meta['rows']} rows, {found.meta['bands']} bands), "
            f"not shard {shard} ({count} of {input_rows} rows, {bands} bands)",
            where=str(path),
            hint="a different recipe stage under the same identity: remove the job's dedup directory",
        )
    return signatures_of(found)


def open_signatures(path: Path, *, identity: str, every_band: bool = False) -> TableReader:
    """A published signature file, its header checked (its indexes and blocks as they are read).
    ``every_band``: for a bucket group, which reads every band's index: all in the first read."""
    return TableReader(path, kind=KIND, identity=identity, head_read=GROUP_HEAD_READ if every_band else HEAD_READ)


def signatures_of(reader: TableReader) -> ShardSignatures:
    meta = reader.meta
    return ShardSignatures(meta["shard"], meta["rows"], meta["bands"], Path(reader.path), meta["input_rows"])
