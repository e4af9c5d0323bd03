"""The deduplication phases run one after another in this process, as the job will run them as tasks:
signatures per shard -> bucket tasks -> the cluster step (or, for exact dedup, each shard's star drops)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data_juicer_elastic.dedup import buckets, clusters, forests, signatures

IDENTITY = "recipe-a/stage-1"


def split_rows(rows: int, num_shards: int) -> list[int]:
    """Contiguous shard sizes, as the plan cuts the input (the first shards one row longer)."""
    base, extra = divmod(rows, num_shards)
    return [base + (1 if shard < extra else 0) for shard in range(num_shards)]


def kept_rows(
    root: Path,
    keys: np.ndarray,
    num_shards: int | list[int],
    method: str,
    *,
    distance: int = 0,
    tasks_per_band: int = 3,
    identity: str = IDENTITY,
    reverse_tasks: bool = False,
    block_entries: int = 3,
    grouped: bool = False,
    merged: bool = False,
    reached: np.ndarray | None = None,
) -> list[int]:
    """The input rows a stage keeps: ``keys`` is ``(rows, bands, 2)`` in input order; ``num_shards``, or
    the shards' row counts; ``reached``: which input rows reach the deduplicator (default: all), as the
    operators before it leave them (the others are neither signed nor kept)."""
    reached = np.ones(len(keys), bool) if reached is None else np.asarray(reached, bool)
    for folder in ("sig", "edges", "drops", "scratch"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    sizes = split_rows(len(keys), num_shards) if isinstance(num_shards, int) else num_shards
    assert sum(sizes) == len(keys)
    starts = np.r_[0, np.cumsum(sizes)]
    readers = []
    for shard, size in enumerate(sizes):
        path = root / "sig" / f"{shard:05d}.sig"
        rows = np.flatnonzero(reached[starts[shard] : starts[shard] + size])
        signatures.publish_signatures(
            path,
            identity=identity,
            shard=shard,
            keys=keys[starts[shard] + rows],
            rows=rows,
            input_rows=size,
            method=method,
            block_entries=block_entries,  # small blocks: range reads cross and skip blocks
        )
        readers.append(signatures.open_signatures(path, identity=identity))
    if grouped:
        readers = [signatures.open_signatures(r.path, identity=identity, every_band=True) for r in readers]
        tasks = buckets.bucket_groups(readers, tasks_per_band)
    else:
        tasks = buckets.bucket_tasks(readers, tasks_per_band)
    if reverse_tasks:
        tasks = tasks[::-1]
    edge_readers = []
    for number, task in enumerate(tasks):
        out = root / "edges" / (f"group-{number:05d}.edges" if grouped else f"{task.name}.edges")
        buckets.run_bucket(task, readers, out, identity=identity, method=method, distance=distance)
        edge_readers.append(buckets.open_edges(out, identity=identity))
    while merged and len(edge_readers) > 1:  # a merge tree, pairs at each level
        level = []
        for at in range(0, len(edge_readers), 2):
            out = root / "edges" / f"merge-{len(edge_readers)}-{at:05d}.edges"
            forests.merge_edges(edge_readers[at : at + 2], out, identity=identity, scratch=root / "scratch")
            level.append(buckets.open_edges(out, identity=identity))
        edge_readers = level
    kept = []
    if method == "exact":
        drops = [clusters.star_drops(edge_readers, shard, size) for shard, size in enumerate(sizes)]
    else:
        clusters.run_cluster(
            edge_readers,
            sizes,
            lambda shard: root / "drops" / f"{shard:05d}.drops",
            identity=identity,
            scratch=root / "scratch",
        )
        drops = [
            clusters.read_drops(root / "drops" / f"{shard:05d}.drops", identity=identity, shard=shard)
            for shard in range(len(sizes))
        ]
    for shard, size in enumerate(sizes):
        dropped = set(drops[shard].tolist())
        kept += [int(starts[shard]) + row for row in range(size) if row not in dropped and reached[starts[shard] + row]]
    return kept
