"""The deduplication phases after hashing against Data-Juicer's own ``process``, on the same hashed rows.

Both sides start from the rows ``document_minhash_deduplicator.compute_hash`` made (Data-Juicer's
defaults: 256 permutations, 25 bands of 10), so hashing, the same work on both sides, is left out:
``--unique`` distinct documents are hashed once and the corpus of ``--rows`` rows repeats them (copies
far apart, as a crawl has them).  Data-Juicer: ``process`` on a ``datasets.Dataset`` of the rows (its
band tables, union-find and filter, one process).  Ours, in this process one after another: keys
(``keys.minhash_keys``), ``--shards`` signature files, bucket groups (``--ranges``), the cluster step;
each phase timed.  The kept rows must be the same (checked).

    python benchmarks/bench_dedup_phases.py --rows 200000 --unique 20000 --shards 8

Needs Data-Juicer (and scipy, for the defaults' band choice).  Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from data_juicer_elastic.dedup import buckets, clusters, keys, signatures

IDENTITY = "bench/stage-1"


def corpus(unique: int, rows: int, seed: int = 7) -> list[int]:
    """The document each row holds: a permutation of repeats of ``unique`` documents."""
    rng = random.Random(seed)
    picks = list(range(unique)) + [rng.randrange(unique) for _ in range(rows - unique)]
    rng.shuffle(picks)
    return picks


def documents(unique: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(5)) for _ in range(5000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randrange(3, 200))) for _ in range(unique)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--unique", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--ranges", type=int, default=4, help="key ranges per band (bucket groups)")
    args = parser.parse_args()

    import datasets
    from data_juicer.ops.deduplicator.document_minhash_deduplicator import DocumentMinhashDeduplicator

    op = DocumentMinhashDeduplicator()
    started = time.perf_counter()
    hashed = [op.compute_hash({"text": text})["__dj__minhash"] for text in documents(args.unique)]
    hash_seconds = time.perf_counter() - started
    picks = corpus(args.unique, args.rows)
    rows = [{"text": str(doc), "index": index, "__dj__minhash": hashed[doc]} for index, doc in enumerate(picks)]

    started = time.perf_counter()
    dataset = datasets.Dataset.from_list(rows)
    load_seconds = time.perf_counter() - started
    started = time.perf_counter()
    kept, _ = op.process(dataset)
    dj_seconds = time.perf_counter() - started
    expected = list(kept["index"])

    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-dedup-phases-") as work:
        root = Path(work)
        started = time.perf_counter()
        all_keys = keys.minhash_keys([hashed[doc] for doc in picks])
        times["keys"] = time.perf_counter() - started
        base, extra = divmod(args.rows, args.shards)
        sizes = [base + (1 if s < extra else 0) for s in range(args.shards)]
        starts = np.r_[0, np.cumsum(sizes)]
        started = time.perf_counter()
        for shard, size in enumerate(sizes):
            part = all_keys[starts[shard] : starts[shard] + size]
            signatures.publish_signatures(
                root / f"{shard}.sig", identity=IDENTITY, shard=shard, keys=part, rows=np.arange(len(part)),
                input_rows=len(part), method="minhash",
            )  # fmt: skip
        times["signatures"] = time.perf_counter() - started
        started = time.perf_counter()
        readers = [
            signatures.open_signatures(root / f"{s}.sig", identity=IDENTITY, every_band=True) for s in range(len(sizes))
        ]
        edge_readers = []
        for number, group in enumerate(buckets.bucket_groups(readers, args.ranges)):
            buckets.run_bucket(group, readers, root / f"{number}.edges", identity=IDENTITY, method="minhash")
            edge_readers.append(buckets.open_edges(root / f"{number}.edges", identity=IDENTITY))
        times["buckets"] = time.perf_counter() - started
        started = time.perf_counter()
        result = clusters.run_cluster(
            edge_readers, sizes, lambda s: root / f"{s}.drops", identity=IDENTITY, scratch=root
        )
        times["cluster"] = time.perf_counter() - started
        kept_ours = []
        for shard, size in enumerate(sizes):
            drops = set(clusters.read_drops(root / f"{shard}.drops", identity=IDENTITY, shard=shard).tolist())
            kept_ours += [int(starts[shard]) + row for row in range(size) if row not in drops]
    ours = sum(times.values())
    print(f"rows {args.rows:,} ({args.unique:,} distinct, hashed once in {hash_seconds:.1f} s), {args.shards} shards")
    print("| side | seconds | split | kept | same rows |")
    print("| --- | --- | --- | --- | --- |")
    print(
        f"| Data-Juicer process | {dj_seconds:.2f} | (Dataset.from_list {load_seconds:.2f} s before it) "
        f"| {len(expected):,} | |"
    )
    split = ", ".join(f"{name} {seconds:.2f}" for name, seconds in times.items())
    print(f"| ours | {ours:.2f} | {split}; {result.rounds} rounds | {len(kept_ours):,} | {kept_ours == expected} |")
    if kept_ours != expected:
        raise SystemExit("the kept rows differ")


if __name__ == "__main__":
    main()
