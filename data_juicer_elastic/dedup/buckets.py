"""Bucket tasks: one band's key range, read from every shard's signature file, turned into edges.

A task is ``(band, low, high)``: the entries of band ``band`` whose ``key`` is in ``[low, high)``, from
every shard (each file read only in the blocks that can hold the range).  The ranges come from the
samples in every signature file's section indexes (``plan_ranges``: weighted quantiles), so tasks are
balanced without a pass over the data; equal keys never straddle two ranges.

Edges are *star* edges ``row -> root``, ``root < row``: within a bucket key every member points at the
key's smallest global row, so a key shared by ``m`` rows (short documents, boilerplate) costs ``m - 1``
edges and one sort, not ``m**2`` pairs.

- exact and MinHash: the bucket key is ``(key, key2)``.  For exact dedup this *is* the decision: every
  ``row`` of an edge is dropped (one band; ``clusters.star_drops`` reads a shard's slice).
- SimHash: the bucket key is ``key`` (the value masked to the band's blocks); rows of one value are
  starred to the value's smallest row (in band 0 only: every band holds them together), and every pair
  of distinct values at most ``distance`` bits apart joins their smallest rows (``simhash_blocks``).

Memory: one task's entries (24 bytes each) and its edges (16 bytes each), bounded by the range.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from data_juicer_elastic.dedup.signatures import band_name
from data_juicer_elastic.dedup.simhash_blocks import pairs_within
from data_juicer_elastic.dedup.tables import TableReader, publish_table
from data_juicer_elastic.errors import IntegrityError

KIND: Final = "dedup-edges"
FIELDS: Final = ("row", "root")
SECTION: Final = "edges"
METHODS: Final = ("exact", "minhash", "simhash")


@dataclass(frozen=True)
class BucketTask:
    band: int
    low: int
    high: int | None  # None: no upper bound (2**64)

    @property
    def name(self) -> str:
        return f"{band_name(self.band)}-{self.low:016x}"


def plan_ranges(samples: Sequence[tuple[Sequence[int], int]], tasks: int) -> list[tuple[int, int | None]]:
    """``tasks`` (or fewer) key ranges covering all of ``[0, 2**64)``, cut at weighted quantiles of the
    shards' samples: ``(sample, entries)`` per shard, each sampled value standing for
    ``entries / len(sample)`` entries."""
    values, weights = [], []
    for sample, entries in samples:
        if sample:
            values.extend(sample)
            weights.extend([entries / len(sample)] * len(sample))
    cuts: list[int] = []
    if tasks > 1 and values:
        order = np.argsort(np.array(values, dtype=np.uint64), kind="stable")
        ordered = np.array(values, dtype=np.uint64)[order]
        cumulative = np.cumsum(np.array(weights)[order])
        targets = cumulative[-1] * np.arange(1, tasks) / tasks
        picks = np.searchsorted(cumulative, targets, "left")
        cuts = sorted({int(ordered[min(p, len(ordered) - 1)]) for p in picks} - {0})
    bounds: list[int | None] = [0, *cuts, None]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]  # type: ignore[misc]


def bucket_tasks(readers: Sequence[TableReader], tasks_per_band: int) -> list[BucketTask]:
    """Every bucket task of a stage: each band cut into up to ``tasks_per_band`` balanced ranges."""
    readers = _with_rows(readers)
    bands = max((reader.meta["bands"] for reader in readers), default=0)
    tasks = []
    for band in range(bands):
        samples = []
        for reader in readers:
            section = reader.section(band_name(band))
            samples.append((section.sample, section.count))
        tasks += [BucketTask(band, low, high) for low, high in plan_ranges(samples, tasks_per_band)]
    return tasks


def _with_rows(readers: Sequence[TableReader]) -> list[TableReader]:
    """The shards whose stage kept rows: a shard left empty (every row filtered before the deduplicator)
    has a signature file without bands (its keys could not say how many)."""
    return [reader for reader in readers if reader.meta["rows"]]


def read_bucket(task: BucketTask, readers: Sequence[TableReader]) -> np.ndarray:
    """The task's entries from every shard, sorted by (key, key2, row)."""
    parts = [reader.read(band_name(task.band), task.low, task.high) for reader in _with_rows(readers)]
    entries = np.concatenate(parts) if parts else np.empty(0, dtype=[(f, "<u8") for f in ("key", "key2", "row")])
    return entries[np.lexsort((entries["row"], entries["key2"], entries["key"]))]


def _stars(first_of_group: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, root) for every row that is not the first of its group (rows sorted within groups)."""
    group = np.cumsum(first_of_group) - 1
    roots = rows[np.flatnonzero(first_of_group)][group]
    member = ~first_of_group
    return rows[member], roots[member]


def bucket_edges(entries: np.ndarray, method: str, band: int = 0, distance: int = 0) -> np.ndarray:
    """The star edges of one task's sorted entries (see the module's docstring), unique, sorted."""
    if method not in METHODS:
        raise ValueError(f"unknown deduplication method {method!r}")
    key, key2, rows = entries["key"], entries["key2"], entries["row"]
    new_key = np.r_[True, key[1:] != key[:-1]] if len(rows) else np.empty(0, bool)
    new_value = new_key | np.r_[True, key2[1:] != key2[:-1]] if len(rows) else new_key
    sources, targets = [], []
    if method != "simhash" or band == 0:
        members, roots = _stars(new_value, rows)
        sources.append(members)
        targets.append(roots)
    if method == "simhash":
        firsts = np.flatnonzero(new_value)  # one entry per distinct (group, value): its smallest row
        groups = np.cumsum(new_key)[firsts]
        left, right = pairs_within(groups, key2[firsts], distance)
        a, b = rows[firsts][left], rows[firsts][right]
        sources.append(np.maximum(a, b))
        targets.append(np.minimum(a, b))
    edges = np.empty(sum(len(s) for s in sources), dtype=[(f, "<u8") for f in FIELDS])
    if len(edges):
        edges["row"], edges["root"] = np.concatenate(sources), np.concatenate(targets)
    return unique_edges(edges)


def unique_edges(edges: np.ndarray) -> np.ndarray:
    """Edges sorted by (row, root), each once (``np.unique`` on the record type is twice as slow)."""
    edges = edges[np.lexsort((edges["root"], edges["row"]))]
    if len(edges) < 2:
        return edges
    differ = (edges["row"][1:] != edges["row"][:-1]) | (edges["root"][1:] != edges["root"][:-1])
    return edges[np.r_[True, differ]]


def bucket_groups(readers: Sequence[TableReader], ranges_per_band: int) -> list[tuple[BucketTask, ...]]:
    """The bucket tasks grouped by range: group ``i`` holds the ``i``-th key range of every band.  A group
    run as one task opens each shard's file once (and can read every band's index in its first read)
    instead of once per band: ``ranges x shards`` opens instead of ``bands x ranges x shards``."""
    by_range: dict[int, list[BucketTask]] = {}
    band, number = -1, 0
    for task in bucket_tasks(readers, ranges_per_band):
        number = number + 1 if task.band == band else 0
        band = task.band
        by_range.setdefault(number, []).append(task)
    return [tuple(by_range[number]) for number in sorted(by_range)]


@dataclass(frozen=True)
class BucketResult:
    tasks: tuple[BucketTask, ...]
    entries: int
    edges: int
    path: Path


def run_bucket(
    tasks: BucketTask | Sequence[BucketTask],
    readers: Sequence[TableReader],
    out: Path,
    *,
    identity: str,
    method: str,
    distance: int = 0,
    before_publish: Callable[[], object] | None = None,
) -> BucketResult:
    """Read the slice of every shard of one task (or of each task of a group, one band at a time), publish
    their edges as one edge file at ``out`` (first valid wins; ``before_publish`` called just before:
    fencing)."""
    group = (tasks,) if isinstance(tasks, BucketTask) else tuple(tasks)
    parts, entries = [], 0
    for task in group:
        found = read_bucket(task, readers)
        entries += len(found)
        parts.append(bucket_edges(found, method, task.band, distance))
    edges = unique_edges(np.concatenate(parts)) if parts else np.empty(0, dtype=[(f, "<u8") for f in FIELDS])
    meta = {"tasks": [[t.band, t.low, t.high] for t in group], "entries": entries, "method": method}
    if before_publish is not None:
        before_publish()
    published = publish_table(out, kind=KIND, identity=identity, fields=FIELDS, sections=[(SECTION, edges)], meta=meta)
    if published.meta["tasks"] != meta["tasks"] or published.meta["method"] != method:
        raise IntegrityError(
            f"holds the edges of {published.meta['method']} tasks {published.meta['tasks']}, not {meta['tasks']}",
            where=str(out),
            hint="two bucket tasks were given one edge file",
        )
    return BucketResult(group, published.meta["entries"], published.section(SECTION).count, Path(out))


def open_edges(path: Path, *, identity: str) -> TableReader:
    return TableReader(path, kind=KIND, identity=identity)
