"""The cluster step: connected components of the edges, each labelled by its smallest global row, and
per-shard drop lists (every row that is not its component's label).

The labels are one dense array over the job's input rows (global row ids made dense by the shards'
input row counts: a row that never reached the stage has no edge and stays its own label): ``uint32``
below 2**32 rows, else ``uint64``.  Memory: ``4 * rows`` (``8 * rows`` past
2**32) bytes plus one chunk of edges (``EDGE_CHUNK`` edges, about 100 bytes each with the temporaries):
1 billion rows take 4 GB + about 0.2 GB.

Hooking and pointer jumping, edges streamed from their files in chunks: for each edge, both ends' roots
(label chains followed to a fixed point, the chain compressed); the larger root is hooked under the
smaller one (``np.minimum.at``: of several candidates the smallest wins).  An edge whose hook lost to a
smaller one is written to a node-local scratch file; after full pointer jumping the next round streams
only the scratch file (much smaller); the step ends when a round leaves nothing.  Each label only ever
decreases and stays in its row's component, a hook removes a root, so the step ends, and at the end every
component is one star whose centre is its smallest row (the smallest row is never hooked: no smaller
row of its component exists).  The result depends on the edges as a set, never on their order or on how
the bucket tasks split them.  Serial: one process, ``rounds * edges`` read.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from data_juicer_elastic.dedup import keys as dedup_keys
from data_juicer_elastic.dedup.buckets import SECTION as EDGE_SECTION
from data_juicer_elastic.dedup.tables import TableReader, publish_table
from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.sharedfs import fsio

KIND: Final = "dedup-drops"
FIELDS: Final = ("row",)
SECTION: Final = "drops"
EDGE_CHUNK: Final = 1 << 21  # edges per chunk of a scratch round
JUMP_CHUNK: Final = 1 << 22  # labels per slice of a pointer-jumping pass


def label_dtype(rows: int) -> np.dtype:
    return np.dtype(np.uint32) if rows < (1 << 32) else np.dtype(np.uint64)


class DenseRows:
    """Global row ids -> dense indices, from every shard's input row count (shards 0 .. n-1)."""

    def __init__(self, shard_rows: Sequence[int]):
        self.counts = np.asarray(shard_rows, dtype=np.int64)
        self.offsets = np.r_[0, np.cumsum(self.counts)].astype(np.int64)
        self.rows = int(self.offsets[-1])

    def dense(self, ids: np.ndarray, where: object) -> np.ndarray:
        shard, row = dedup_keys.shard_of(ids), dedup_keys.row_of(ids)
        bad = (shard >= len(self.counts)) | (row >= self.counts[np.minimum(shard, len(self.counts) - 1)])
        if bool(bad.any()):
            raise IntegrityError(
                "an edge names a row the shards do not have (a file of another job or stage)",
                where=str(where),
                hint="remove the stage's dedup files; their phases recompute them",
            )
        return self.offsets[shard] + row


def _roots(labels: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Each node's root; the nodes' own labels set to it (path compression of the queried nodes).  Each
    pass follows only the chains not yet at a root."""
    roots = labels[nodes]
    moving = np.arange(len(roots))
    while len(moving):
        up = labels[roots[moving]]
        climbed = up != roots[moving]
        moving = moving[climbed]
        roots[moving] = up[climbed]
    labels[nodes] = roots
    return roots


def _jump(labels: np.ndarray) -> None:
    """Pointer jumping in place until every label is a root (slices ascending: a label points lower,
    so its target's slice is already done in this pass)."""
    changed = True
    while changed:
        changed = False
        for start in range(0, len(labels), JUMP_CHUNK):
            part = labels[start : start + JUMP_CHUNK]
            up = labels[part]
            if not np.array_equal(up, part):
                labels[start : start + JUMP_CHUNK] = up
                changed = True


def _hook(labels: np.ndarray, left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hook the larger root of each edge under the smaller; the edges whose hook lost, as (high, low)."""
    a, b = _roots(labels, left), _roots(labels, right)
    differ = a != b
    high, low = np.maximum(a[differ], b[differ]), np.minimum(a[differ], b[differ])
    np.minimum.at(labels, high, low)
    lost = labels[high] != low
    lost_high, lost_low = high[lost], low[lost]
    # the hooks of one chunk can chain (a hooked root was the low end of another edge): jump the
    # hooked roots' pointers until each points at a root, log(depth) passes
    hooked = high  # duplicates do no harm (np.unique would cost more than the jumps)
    while len(hooked):
        parent = labels[hooked]
        grand = labels[parent]
        climbed = grand != parent
        hooked = hooked[climbed]
        labels[hooked] = grand[climbed]
    return lost_high, lost_low


@dataclass
class Components:
    labels: np.ndarray
    rounds: int
    edges_read: int


def components(rows: int, chunks: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]], scratch: Path) -> Components:
    """Min-labelled components of ``rows`` dense rows; ``chunks()`` yields the edges as (left, right)
    dense index arrays, a bounded chunk at a time.  ``scratch``: a node-local directory."""
    dtype = label_dtype(rows)
    labels = np.arange(rows, dtype=dtype)
    source: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]] = chunks
    rounds = edges_read = 0
    with tempfile.TemporaryDirectory(dir=scratch, prefix="dedup-cluster-") as work:
        while True:
            rounds += 1
            out = Path(work) / f"round-{rounds}.bin"
            left_over = 0
            with open(out, "wb") as handle:
                for left, right in source():
                    edges_read += len(left)
                    high, low = _hook(labels, left.astype(dtype, copy=False), right.astype(dtype, copy=False))
                    if len(high):
                        np.stack([high, low], axis=1).astype(dtype).tofile(handle)
                        left_over += len(high)
            _jump(labels)
            if rounds > 1:
                with contextlib.suppress(OSError):
                    os.unlink(Path(work) / f"round-{rounds - 1}.bin")
            if not left_over:
                return Components(labels, rounds, edges_read)
            source = _scratch_reader(out, dtype, left_over)


def _scratch_reader(path: Path, dtype: np.dtype, count: int) -> Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]:
    def read() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for start in range(0, count, EDGE_CHUNK):
            pairs = np.fromfile(
                path, dtype=dtype, count=2 * min(EDGE_CHUNK, count - start), offset=2 * start * dtype.itemsize
            )
            pairs = pairs.reshape(-1, 2)
            yield pairs[:, 0], pairs[:, 1]

    return read


def edge_chunks(
    readers: Sequence[TableReader], rows: DenseRows
) -> Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]:
    """The edges of every bucket task's file, as dense index pairs, a few checked blocks at a time."""

    def read() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for reader in readers:
            for block in reader.iter_blocks(EDGE_SECTION):
                yield rows.dense(block["row"], reader.path), rows.dense(block["root"], reader.path)

    return read


@dataclass(frozen=True)
class ClusterResult:
    rounds: int
    edges_read: int
    rows: int
    dropped: tuple[int, ...]  # per shard


def publish_drop_list(path: Path, *, identity: str, shard: int, rows: int, drops: np.ndarray) -> int:
    """Publish one shard's drop list (input row numbers within the shard, sorted; ``rows``: its input
    rows); the number of rows it drops."""
    entries = np.empty(len(drops), dtype=[("row", "<u8")])
    entries["row"] = np.sort(np.asarray(drops, dtype=np.uint64))
    meta = {"shard": shard, "rows": rows, "dropped": len(entries)}
    found = publish_table(path, kind=KIND, identity=identity, fields=FIELDS, sections=[(SECTION, entries)], meta=meta)
    if (found.meta["shard"], found.meta["rows"]) != (shard, rows):
        raise IntegrityError(
            f"holds the drop list of shard {found.meta['shard']} ({found.meta['rows']} rows), not {shard} ({rows})",
            where=str(path),
        )
    return int(found.meta["dropped"])


def run_cluster(
    edge_readers: Sequence[TableReader],
    shard_rows: Sequence[int],
    drop_path: Callable[[int], Path],
    *,
    identity: str,
    scratch: Path,
    before_publish: Callable[[], object] | None = None,
    extra_drops: Sequence[np.ndarray] | None = None,
) -> ClusterResult:
    """The cluster step of a stage: components over every edge file, one drop list per shard.
    ``shard_rows``: every shard's input row count (rows that never reached the stage have no edges);
    ``before_publish``: called once the components are known, before the first drop list (fencing);
    ``extra_drops``: per shard, input rows the stage drops besides (their hashing failed)."""
    rows = DenseRows(shard_rows)
    found = components(rows.rows, edge_chunks(edge_readers, rows), scratch)
    if before_publish is not None:
        before_publish()

    def publish(shard: int) -> int:
        start, count = int(rows.offsets[shard]), int(rows.counts[shard])
        own = found.labels[start : start + count]
        drops = np.flatnonzero(own != np.arange(start, start + count, dtype=own.dtype))
        if extra_drops is not None and len(extra_drops[shard]):
            drops = np.union1d(drops, np.asarray(extra_drops[shard], dtype=np.int64))
        return publish_drop_list(drop_path(shard), identity=identity, shard=shard, rows=count, drops=drops)

    # one small file per shard: their creates, fsyncs and links overlap on threads (they release the GIL)
    dropped = fsio.read_many(publish, range(len(rows.counts)))
    return ClusterResult(found.rounds, found.edges_read, rows.rows, tuple(dropped))


def star_drops(edge_readers: Sequence[TableReader], shard: int, rows: int) -> np.ndarray:
    """Exact dedup's drop list for one shard (``rows``: its input rows), without a cluster step: every
    edge's ``row`` in the shard (each file read only in the blocks of that shard's id range)."""
    low = shard << dedup_keys.ROW_BITS
    high = (shard + 1) << dedup_keys.ROW_BITS
    parts = [reader.read(EDGE_SECTION, low, high if high < 1 << 64 else None)["row"] for reader in edge_readers]
    found = np.unique(np.concatenate(parts)) if parts else np.empty(0, np.uint64)
    local = dedup_keys.row_of(found)
    if len(local) and int(local.max()) >= rows:
        raise IntegrityError(f"an edge names row {int(local.max())} of shard {shard}, which has {rows}")
    return local


def read_drops(path: Path, *, identity: str, shard: int) -> np.ndarray:
    """A shard's published drop list (input row numbers within the shard, sorted), checked."""
    reader = TableReader(path, kind=KIND, identity=identity)
    if reader.meta["shard"] != shard:
        raise IntegrityError(f"holds the drop list of shard {reader.meta['shard']}, not {shard}", where=str(path))
    return np.concatenate(list(reader.iter_blocks(SECTION)) or [np.empty(0, reader.dtype)])["row"].astype(np.int64)
