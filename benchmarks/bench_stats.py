"""Cost of the per-shard stats summary, as ratios measured in the same run.

1. Writing one shard's processed rows (``row_writer.write_shard``: restore against the
   input, split the stats into the row stats file, encode) without and with the stats hook:
   the hook's added share of the write step (rows with 4 numeric stats and 1 string stat,
   like a typical text-quality recipe).
2. Finalize's merge of S per-shard summaries (parse + merge + overall record) vs reading
   the S done markers it needs anyway.

    python benchmarks/bench_stats.py --rows 100000 --shards 1000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import tempfile
import time
from pathlib import Path

from data_juicer_elastic.execution.row_types import ArrowRows
from data_juicer_elastic.execution.row_writer import ExportLayout, write_shard
from data_juicer_elastic.execution.shard_reader import InputRows, read_tables
from data_juicer_elastic.rows.row_schema import RowSchema
from data_juicer_elastic.rows.shard_source import ShardSource, SourceSpan
from data_juicer_elastic.stats.overall import analysis_percentiles, overall_csv, overall_record
from data_juicer_elastic.stats.shard_hook import ShardStatsRecorder
from data_juicer_elastic.stats.shard_summary import StatsSummary, merge_summaries

STATS = "__dj__stats__"


def make_part(path: Path, rows: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows):
            n = rng.randint(10, 5000)
            stats = {
                "text_len": n,
                "num_words": n // 5,
                "alnum_ratio": rng.random(),
                "special_char_ratio": rng.random() / 10,
                "lang": rng.choice(["en", "zh", "fr"]),
            }
            handle.write(json.dumps({"id": i, "text": "x" * (n % 200), STATS: stats}) + "\n")


def whole_file(path: Path) -> ShardSource:
    """The file as one shard read in place (what a one-shard plan of it gives)."""
    content, stat = path.read_bytes(), path.stat()
    span = SourceSpan(str(path), 0, len(content), "none", stat.st_size, stat.st_mtime_ns, content.count(b"\n"))
    return ShardSource("part-00000-of-00001", (span,), len(content), hashlib.sha256(content).hexdigest(), 0)


def best_of(times: int, fn) -> float:
    best = float("inf")
    for _ in range(times):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        part = root / "part_000000.json"
        make_part(part, args.rows, 1)
        schema = RowSchema()
        schema.observe_all(json.loads(line) for line in part.open())
        rows = ArrowRows.from_manifest(schema.to_json(), where="bench")
        source = whole_file(part)
        tables = read_tables(source, rows)  # what the operators hand the writer (here: unchanged)

        def write(name: str, on_row=None):
            inputs = InputRows(source)
            try:
                return write_shard(
                    tables, tables[0].column_names, inputs, root / f"{name}.jsonl",
                    root / f"{name}-stats.jsonl", ExportLayout(), on_row=on_row,
                ).output  # fmt: skip
            finally:
                inputs.close()

        plain = best_of(args.repeat, lambda: write("plain"))

        def hooked() -> None:
            recorder = ShardStatsRecorder("part-00000-of-00001", "a", root)
            out = write("hooked", recorder.observe)
            recorder.write(out.rows, out.sha256)

        with_stats = best_of(args.repeat, hooked)
        print(
            f"write_shard, {args.rows} rows: {plain:.2f} s plain, {with_stats:.2f} s with stats "
            f"-> ratio {with_stats / plain:.2f}"
        )
        summary_bytes = (root / "stats.json").read_bytes()
        print(f"one shard's summary: {len(summary_bytes)} bytes")

        # finalize: S summaries of 1,000-row shards vs reading S small done-marker-sized files
        make_part(part, 1000, 2)
        small = StatsSummary.of_rows(json.loads(line) for line in part.open()).encode()
        marker = b"{" + b'"k": "' + b"x" * 600 + b'"}\n'
        for i in range(args.shards):
            (root / f"s{i}.json").write_bytes(small)
            (root / f"d{i}.json").write_bytes(marker)

        def merge_all() -> None:
            parts = (StatsSummary.parse((root / f"s{i}.json").read_bytes(), "s") for i in range(args.shards))
            merged = merge_summaries(parts)
            overall_record(merged, analysis_percentiles(None), shards=args.shards, recomputed=[])
            overall_csv(merged, analysis_percentiles(None))

        def read_markers() -> None:
            for i in range(args.shards):
                json.loads((root / f"d{i}.json").read_bytes())

        merge_secs = best_of(args.repeat, merge_all)
        marker_secs = best_of(args.repeat, read_markers)
        print(
            f"finalize stats for {args.shards} shards: {merge_secs:.2f} s "
            f"({merge_secs / args.shards * 1e3:.2f} ms/shard); reading as many done markers: {marker_secs:.3f} s"
        )


if __name__ == "__main__":
    main()
