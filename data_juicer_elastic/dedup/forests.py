"""Edge files merged into forests before the serial cluster step, on any node, in parallel.

Bucket tasks of different bands write the same edge many times (an exact copy collides in every band:
``row -> root`` 25 times with Data-Juicer's MinHash defaults).  A merge reads a few edge files, finds
the components of their edges (``clusters.components`` over the rows they name, made dense by sorting
the ids) and writes one edge per joined row, ``row -> the smallest row of its component``: a forest of
stars.  The components of the union of several edge sets are those of the union of their forests, so
merging files in a tree (pairs, then pairs of merged files, ...) leaves the cluster step the same
result to compute from at most one edge per row each merged file saw joined.

Memory: the inputs' edges (16 bytes each) and their distinct rows (8 + 4 bytes each), bounded by the
inputs, not the job.  The output is a ``buckets`` edge file, read by the cluster step like any other.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_juicer_elastic.dedup.buckets import FIELDS, KIND, SECTION, unique_edges
from data_juicer_elastic.dedup.clusters import components
from data_juicer_elastic.dedup.tables import TableReader, publish_table
from data_juicer_elastic.errors import IntegrityError


def star_forest(row: np.ndarray, root: np.ndarray, scratch: Path) -> np.ndarray:
    """The star forest of edges ``row -> root``: one edge ``member -> smallest row of its component`` per
    member that is not the smallest, sorted."""
    ids, inverse = np.unique(np.concatenate([row, root]).astype(np.uint64), return_inverse=True)
    left, right = inverse[: len(row)], inverse[len(row) :]

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        yield left, right

    labels = components(len(ids), chunks, scratch).labels
    members = np.flatnonzero(labels != np.arange(len(ids), dtype=labels.dtype))
    edges = np.empty(len(members), dtype=[(f, "<u8") for f in FIELDS])
    edges["row"], edges["root"] = ids[members], ids[labels[members]]  # ids sorted: local min = global min
    return unique_edges(edges)


@dataclass(frozen=True)
class ForestResult:
    inputs: tuple[str, ...]
    edges_in: int
    edges_out: int
    path: Path


def merge_edges(readers: Sequence[TableReader], out: Path, *, identity: str, scratch: Path) -> ForestResult:
    """Merge edge files (bucket tasks' or earlier merges') into one forest file at ``out`` (first valid
    wins)."""
    parts = [np.concatenate(list(reader.iter_blocks(SECTION)) or [np.empty(0, reader.dtype)]) for reader in readers]
    edges = np.concatenate(parts) if parts else np.empty(0, dtype=[(f, "<u8") for f in FIELDS])
    forest = star_forest(edges["row"], edges["root"], scratch)
    inputs = [Path(reader.path).name for reader in readers]
    meta = {"merged": inputs, "edges_in": len(edges)}
    found = publish_table(out, kind=KIND, identity=identity, fields=FIELDS, sections=[(SECTION, forest)], meta=meta)
    if found.meta.get("merged") != inputs:
        raise IntegrityError(
            f"holds a merge of {found.meta.get('merged')}, not of {inputs}",
            where=str(out),
            hint="two merges were given one output file",
        )
    return ForestResult(tuple(inputs), int(found.meta["edges_in"]), found.section(SECTION).count, Path(out))
