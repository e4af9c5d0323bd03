"""The deduplication cluster step on synthetic edges: time and peak memory, projected to 1 billion rows.

Writes ``--edges`` star edges over ``--rows`` stage rows in ``--shards`` shards as ``--files`` edge files
(the bucket tasks' output: ``dedup.buckets`` tables, sorted, checksummed), then runs the real cluster
step (``clusters.run_cluster``: every edge file streamed in checked blocks, min-label components,
one drop list per shard published) in a fresh process, so that its peak RSS is its own.

Edges: each points a row at a smaller one (``row -> root``, as bucket tasks write them).  ``--graph
random``: the root uniform below the row (one giant component: the most hooking, the stress case);
``--graph copies``: the root 1 to 10**6 rows earlier (log-uniform), many small groups of copies,
closer to what MinHash bands give.

    python benchmarks/bench_dedup_cluster.py --rows 10000000 --edges 10000000
    python benchmarks/bench_dedup_cluster.py --rows 100000000 --edges 100000000 --graph copies

Prints one Markdown row and, with ``--json``, one JSON object.  The projection to 1 billion rows is
linear in the edges read (``edges_read`` counts every round) and in the rows (the label array and the
drop lists); memory: ``4 * rows`` bytes of labels plus the chunk buffers (``clusters.EDGE_CHUNK``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from data_juicer_elastic.dedup import buckets, clusters, keys, tables

IDENTITY = "bench/stage-1"
BILLION = 1_000_000_000


def shard_sizes(rows: int, shards: int) -> list[int]:
    base, extra = divmod(rows, shards)
    return [base + (1 if s < extra else 0) for s in range(shards)]


def to_global(dense: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    shard = np.searchsorted(offsets, dense, "right") - 1
    return (shard.astype(np.uint64) << np.uint64(keys.ROW_BITS)) + (dense - offsets[shard]).astype(np.uint64)


def write_edges(work: Path, rows: int, edges: int, shards: int, files: int, graph: str) -> float:
    rng = np.random.default_rng(12345)
    offsets = np.r_[0, np.cumsum(shard_sizes(rows, shards))].astype(np.int64)
    started = time.perf_counter()
    per_file = -(-edges // files)
    for number in range(files):
        count = min(per_file, edges - number * per_file)
        if count <= 0:
            break
        if graph == "random":
            row = rng.integers(1, rows, count, dtype=np.int64)
            root = (rng.random(count) * row).astype(np.int64)
        else:  # a copy's original 1 to 10**6 rows earlier, log-uniform
            row = rng.integers(1, rows, count, dtype=np.int64)
            back = np.exp(rng.random(count) * np.log(1e6)).astype(np.int64)
            root = row - np.minimum(row, np.maximum(back, 1))
        entries = np.empty(len(row), dtype=[(f, "<u8") for f in buckets.FIELDS])
        entries["row"], entries["root"] = to_global(row, offsets), to_global(root, offsets)
        entries = np.unique(entries)
        tables.write_table(
            work / f"edges-{number:04d}.tbl",
            kind=buckets.KIND,
            identity=IDENTITY,
            fields=buckets.FIELDS,
            sections=[(buckets.SECTION, entries)],
        )
    return time.perf_counter() - started


def cluster(work: Path, rows: int, shards: int) -> dict:
    readers = [buckets.open_edges(path, identity=IDENTITY) for path in sorted(work.glob("edges-*.tbl"))]
    (work / "drops").mkdir(exist_ok=True)
    started = time.perf_counter()
    result = clusters.run_cluster(
        readers,
        shard_sizes(rows, shards),
        lambda shard: work / "drops" / f"{shard:05d}.drops",
        identity=IDENTITY,
        scratch=work,
    )
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "rounds": result.rounds,
        "edges_read": result.edges_read,
        "edges_in_files": sum(r.section(buckets.SECTION).count for r in readers),
        "dropped": sum(result.dropped),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "label_bytes": rows * clusters.label_dtype(rows).itemsize,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--edges", type=int, default=10_000_000)
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--files", type=int, default=32, help="edge files (bucket tasks)")
    parser.add_argument("--graph", choices=["random", "copies"], default="random")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cluster-only", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cluster_only:  # the child: the cluster step alone, its own peak RSS
        print(json.dumps(cluster(args.cluster_only, args.rows, args.shards)))
        return
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="bench-dedup-") as work:
        write_seconds = write_edges(Path(work), args.rows, args.edges, args.shards, args.files, args.graph)
        command = [
            sys.executable,
            __file__,
            "--cluster-only",
            work,
            "--rows",
            str(args.rows),
            "--shards",
            str(args.shards),
        ]
        child = subprocess.run(command, capture_output=True, text=True, env=os.environ, check=False)
        if child.returncode:
            sys.exit(child.stderr[-3000:])
        found = json.loads(child.stdout.strip().splitlines()[-1])
    scale = BILLION / args.rows
    found |= {
        "rows": args.rows,
        "graph": args.graph,
        "write_seconds": write_seconds,
        "edges_per_second": found["edges_read"] / found["seconds"],
        # linear in rows and edges: the same edges per row, the same rounds
        "projected_seconds_1b_rows": found["seconds"] * scale,
        "projected_label_bytes_1b_rows": BILLION * clusters.label_dtype(BILLION).itemsize,
        "projected_peak_bytes_1b_rows": BILLION * clusters.label_dtype(BILLION).itemsize
        + (found["peak_rss_bytes"] - found["label_bytes"]),
    }
    gib = 1024**3
    print("| rows | edges | graph | rounds | edges read | seconds | peak RSS | 1 B rows: time, peak |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(
        f"| {args.rows:,} | {found['edges_in_files']:,} | {args.graph} | {found['rounds']} | {found['edges_read']:,} "
        f"| {found['seconds']:.1f} | {found['peak_rss_bytes'] / gib:.2f} GiB "
        f"| {found['projected_seconds_1b_rows'] / 60:.0f} min, {found['projected_peak_bytes_1b_rows'] / gib:.1f} GiB |"
    )
    if args.json:
        print(json.dumps(found))


if __name__ == "__main__":
    main()
