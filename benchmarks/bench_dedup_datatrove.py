"""datatrove 0.10.1's MinHash pipeline against this package's deduplication phases, same rows, same bands.

A corpus of ``--rows`` rows (generated, no download: distinct documents of random words, and copies of
them far apart: exact copies, case and punctuation variants, near copies with a few words replaced) is
written as ``--shards`` JSONL files.  Both sides use the same band parameters: datatrove's
``MinhashConfig`` (``--bands`` buckets of ``--rows-per-band`` hashes, ``--ngrams`` word n-grams) and
``document_minhash_deduplicator`` with ``num_bands``, ``num_rows_per_band``, ``num_permutations`` =
bands x rows per band and ``window_size`` = n-grams (space tokenization; datatrove gets a whitespace word
tokenizer too, so neither needs a language model).  Each side runs its four stages with ``--workers``
processes:

- datatrove: ``LocalPipelineExecutor`` running signatures (one task per file), buckets (one per band),
  cluster (one task), filter (one per file, writing the kept rows);
- ours: signatures (a process pool: per shard, the rows read, Data-Juicer's own ``compute_hash``,
  ``keys.minhash_keys``, ``signatures.publish_signatures``), bucket groups (the pool; ``--ranges``
  key ranges), the cluster step (serial, ``clusters.run_cluster``), drops (the pool: per shard, its drop
  list read and the kept rows written).

Printed: each stage's wall seconds, the ratio, and the rows each keeps: both, ours only, datatrove only
(their hashes differ, so their near-copy groups differ, and datatrove keeps a different copy of a
group).  ``--check-default`` also runs Data-Juicer's own ``process`` on our hashes (untimed) and checks
that ours keeps exactly its rows.

    pip install --target /tmp/datatrove-deps datatrove==0.10.1
    PYTHONPATH=/tmp/datatrove-deps python benchmarks/bench_dedup_datatrove.py --rows 100000 --check-default

Needs Data-Juicer and scipy.  Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pickle
import random
import string
import tempfile
import time
from pathlib import Path

IDENTITY = "bench/datatrove/stage-1"


def corpus(rows: int, copies: float, seed: int = 5) -> list[str]:
    """``rows`` documents, a ``copies`` share of them copies of others (a third exact, a third case and
    punctuation variants, a third near copies), shuffled so copies lie far apart."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randrange(3, 9))) for _ in range(20_000)]
    distinct = rows - int(rows * copies)
    docs = [" ".join(rng.choice(words) for _ in range(rng.randrange(30, 300))) for _ in range(distinct)]
    out = list(docs)
    for number in range(rows - distinct):
        tokens = rng.choice(docs).split(" ")
        kind = number % 3
        if kind == 1:  # case and punctuation
            tokens = [t.capitalize() if rng.random() < 0.2 else t for t in tokens]
            tokens = [t + rng.choice(",.;!?") if rng.random() < 0.1 else t for t in tokens]
        elif kind == 2:  # near copy: about 3 % of the words replaced
            tokens = [rng.choice(words) if rng.random() < 0.03 else t for t in tokens]
        out.append(" ".join(tokens))
    rng.shuffle(out)
    return out


def write_shards(docs: list[str], shards: int, folder: Path) -> list[int]:
    folder.mkdir(parents=True)
    base, extra = divmod(len(docs), shards)
    sizes = [base + (1 if s < extra else 0) for s in range(shards)]
    start = 0
    for shard, size in enumerate(sizes):
        with (folder / f"{shard:05d}.jsonl").open("w", encoding="utf-8") as out:
            for index in range(start, start + size):
                out.write(json.dumps({"id": str(index), "text": docs[index]}) + "\n")
        start += size
    return sizes


# ---- ours -------------------------------------------------------------------------------------------


def _dj_op(args: argparse.Namespace):
    from data_juicer.ops.deduplicator.document_minhash_deduplicator import DocumentMinhashDeduplicator

    return DocumentMinhashDeduplicator(
        tokenization="space",
        window_size=args.ngrams,
        num_permutations=args.bands * args.rows_per_band,
        num_bands=args.bands,
        num_rows_per_band=args.rows_per_band,
    )


def _our_signatures(job: tuple) -> int:
    from data_juicer_elastic.dedup import keys, signatures

    args, shard, work = job
    op = _dj_op(args)
    with (work / "in" / f"{shard:05d}.jsonl").open(encoding="utf-8") as rows:
        hashes = [op.compute_hash({"text": json.loads(line)["text"]})["__dj__minhash"] for line in rows]
    if args.check_default:
        (work / "hashes" / f"{shard}.pickle").write_bytes(pickle.dumps(hashes))
    signatures.publish_signatures(
        work / "sig" / f"{shard}.sig",
        identity=IDENTITY,
        shard=shard,
        keys=keys.minhash_keys(hashes),
        method="minhash",
    )
    return len(hashes)


def _readers(work: Path, shards: int) -> list:
    from data_juicer_elastic.dedup import signatures

    return [
        signatures.open_signatures(work / "sig" / f"{s}.sig", identity=IDENTITY, every_band=True) for s in range(shards)
    ]


def _our_bucket_group(job: tuple) -> None:
    from data_juicer_elastic.dedup import buckets

    ranges, number, shards, work = job
    readers = _readers(work, shards)
    group = buckets.bucket_groups(readers, ranges)[number]
    buckets.run_bucket(group, readers, work / "edges" / f"{number}.edges", identity=IDENTITY, method="minhash")


def _our_drops(job: tuple) -> list[str]:
    from data_juicer_elastic.dedup import clusters

    shard, work = job
    drops = set(clusters.read_drops(work / "drops" / f"{shard}.drops", identity=IDENTITY, shard=shard).tolist())
    kept = []
    with (work / "in" / f"{shard:05d}.jsonl").open(encoding="utf-8") as rows:
        with (work / "out" / f"{shard:05d}.jsonl").open("w", encoding="utf-8") as out:
            for row, line in enumerate(rows):
                if row not in drops:
                    out.write(line)
                    kept.append(json.loads(line)["id"])
    return kept


def run_ours(args: argparse.Namespace, sizes: list[int], work: Path) -> tuple[dict[str, float], set[str], int]:
    from data_juicer_elastic.dedup import buckets, clusters

    for name in ("sig", "edges", "drops", "out", "scratch", "hashes"):
        (work / name).mkdir()
    shards, times = len(sizes), {}
    context = multiprocessing.get_context("fork")
    with context.Pool(args.workers) as pool:
        started = time.perf_counter()
        assert pool.map(_our_signatures, [(args, s, work) for s in range(shards)], chunksize=1) == sizes
        times["signatures"] = time.perf_counter() - started

        started = time.perf_counter()
        groups = len(buckets.bucket_groups(_readers(work, shards), args.ranges))
        pool.map(_our_bucket_group, [(args.ranges, n, shards, work) for n in range(groups)], chunksize=1)
        times["buckets"] = time.perf_counter() - started

        started = time.perf_counter()
        edges = [buckets.open_edges(work / "edges" / f"{n}.edges", identity=IDENTITY) for n in range(groups)]
        result = clusters.run_cluster(
            edges, sizes, lambda s: work / "drops" / f"{s}.drops", identity=IDENTITY, scratch=work / "scratch"
        )
        times["cluster"] = time.perf_counter() - started

        started = time.perf_counter()
        kept = {row for rows in pool.map(_our_drops, [(s, work) for s in range(shards)], chunksize=1) for row in rows}
        times["drops"] = time.perf_counter() - started
    return times, kept, result.rounds


def default_kept(args: argparse.Namespace, sizes: list[int], work: Path) -> set[str]:
    """Data-Juicer's own ``process`` on our hashes, in input order: the rows the default executor keeps."""
    import datasets

    hashes = [h for s in range(len(sizes)) for h in pickle.loads((work / "hashes" / f"{s}.pickle").read_bytes())]
    dataset = datasets.Dataset.from_list([{"text": "", "id": str(i), "__dj__minhash": h} for i, h in enumerate(hashes)])
    kept, _ = _dj_op(args).process(dataset)
    return set(kept["id"])


# ---- datatrove ----------------------------------------------------------------------------------------


def run_datatrove(args: argparse.Namespace, shards: int, work: Path) -> tuple[dict[str, float], set[str]]:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Whitespace(WordTokenizer):  # the shingles of Data-Juicer's space tokenization, no language model
        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    config = MinhashConfig(n_grams=args.ngrams, num_buckets=args.bands, hashes_per_bucket=args.rows_per_band)
    dt = work / "datatrove"
    source = str(work / "in")

    def reader():
        return JsonlReader(source, compression=None, glob_pattern="*.jsonl")

    stages = {
        "signatures": (
            [reader(), MinhashDedupSignature(str(dt / "sigs"), config=config, language=Whitespace())],
            shards,
        ),
        "buckets": ([MinhashDedupBuckets(str(dt / "sigs"), str(dt / "buckets"), config=config)], config.num_buckets),
        "cluster": ([MinhashDedupCluster(str(dt / "buckets"), str(dt / "remove"), config=config)], 1),
        "filter": (
            [reader(), MinhashDedupFilter(str(dt / "remove")), JsonlWriter(str(dt / "out"), compression=None)],
            shards,
        ),
    }
    times = {}
    for name, (pipeline, tasks) in stages.items():
        started = time.perf_counter()
        LocalPipelineExecutor(
            pipeline=pipeline, tasks=tasks, workers=min(args.workers, tasks), logging_dir=str(dt / "logs" / name)
        ).run()
        times[name] = time.perf_counter() - started
    kept = {json.loads(line)["id"] for path in (dt / "out").glob("*.jsonl") for line in path.open(encoding="utf-8")}
    return times, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--copies", type=float, default=0.3, help="share of rows that copy another")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bands", type=int, default=14, help="datatrove's num_buckets (its default)")
    parser.add_argument("--rows-per-band", type=int, default=8, help="datatrove's hashes_per_bucket (its default)")
    parser.add_argument("--ngrams", type=int, default=5, help="datatrove's n_grams = Data-Juicer's window_size")
    parser.add_argument("--ranges", type=int, default=4, help="key ranges per band (our bucket groups)")
    parser.add_argument("--check-default", action="store_true", help="check ours against Data-Juicer's process")
    args = parser.parse_args()

    _dj_op(args)  # the imports both sides' workers inherit (fork), outside the timings
    from importlib.metadata import version

    with tempfile.TemporaryDirectory(prefix="bench-dedup-datatrove-") as folder:
        work = Path(folder)
        sizes = write_shards(corpus(args.rows, args.copies), args.shards, work / "in")
        dt_times, dt_kept = run_datatrove(args, args.shards, work)
        our_times, our_kept, rounds = run_ours(args, sizes, work)
        default = default_kept(args, sizes, work) if args.check_default else None

    dt_total, our_total = sum(dt_times.values()), sum(our_times.values())
    print(
        f"rows {args.rows:,} ({args.copies:.0%} copies), {args.shards} shards, {args.workers} workers; "
        f"{args.bands} bands x {args.rows_per_band} rows, {args.ngrams}-grams; datatrove {version('datatrove')}"
    )
    print("| side | seconds | split | kept |")
    print("| --- | --- | --- | --- |")
    split = ", ".join(f"{name} {seconds:.1f}" for name, seconds in dt_times.items())
    print(f"| datatrove | {dt_total:.1f} | {split} | {len(dt_kept):,} |")
    split = ", ".join(f"{name} {seconds:.1f}" for name, seconds in our_times.items())
    print(f"| ours | {our_total:.1f} | {split} (cluster: {rounds} rounds) | {len(our_kept):,} |")
    print(
        f"\nours / datatrove wall time: {our_total / dt_total:.2f}x; kept by both {len(our_kept & dt_kept):,}, "
        f"by ours only {len(our_kept - dt_kept):,}, by datatrove only {len(dt_kept - our_kept):,}"
    )
    if default is not None:
        print(f"ours keeps exactly the rows Data-Juicer's process keeps: {our_kept == default}")
        if our_kept != default:
            raise SystemExit("the kept rows differ from Data-Juicer's")


if __name__ == "__main__":
    main()
