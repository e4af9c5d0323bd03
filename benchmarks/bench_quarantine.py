"""Cost of quarantine when nothing fails, as ratios measured in the same run.

Under ``elastic_sharded`` every Mapper's and Filter's ``process`` / ``compute_stats`` is
quarantine's wrapper (``quarantine.collector``) instead of Data-Juicer's: per call it looks up
the operator's attempt context and calls the method; a batch is bisected only when it fails.
This measures that per-call cost on real Data-Juicer operators, called the way Ray Data calls
them (``map_batches`` with ``batch_format="pyarrow"``): two batched built-ins on 1,000-row
batches (``whitespace_normalization_mapper``, ``text_length_filter``'s stats and its keep
decision, which Data-Juicer hands a dict), and the worst
case for a per-call cost, a cheap per-row Mapper (``process_single``: Ray gives non-batched
operators one-row batches, so it is called once per row).  For each operator the same instance is timed with its
``work_dir`` pointing at an attempt context (quarantine active) and at an empty directory
(Data-Juicer's own wrapper runs): each batch is called with both, back to back in alternating
order, in every round; per batch and variant the fastest of the rounds counts (on a shared,
loaded machine the least disturbed call), and the result is the ratio of their sums
(quarantine / Data-Juicer), measured in the same run.

    python benchmarks/bench_quarantine.py --rows 20000 --rounds 15
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from data_juicer.ops.base_op import OPERATORS, Mapper

from data_juicer_elastic.batching.runtime import BatchingContext, StageRef, write_context
from data_juicer_elastic.execution.row_types import ROW_COLUMN
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.quarantine.collector import QuarantinedBatch, QuarantinedRow

WORDS = ["data", "juicer", "élastique", "shard", "row", "quarantine", "测试", "text", "  ", "\u3000"]


def make_rows(rows: int, seed: int = 7) -> pa.Table:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 80))) for _ in range(rows)]
    return pa.table({"text": texts, "id": list(range(rows)), ROW_COLUMN: list(range(rows))})


class StripMapper(Mapper):
    """A per-row Mapper doing almost nothing: the call itself is what is measured."""

    def process_single(self, sample):
        sample["text"] = sample["text"].strip()
        return sample


def compare(op, fn, batches: list, work_dirs: dict[str, str], rounds: int) -> dict[str, float]:
    """Each batch is called with both variants back to back (the order alternating), ``rounds`` times;
    per batch and variant the fastest call counts, summed over the batches."""
    best: dict[str, list[float]] = {name: [float("inf")] * len(batches) for name in work_dirs}
    names = list(work_dirs)
    for r in range(rounds):
        for i, batch in enumerate(batches):
            for name in names if (r + i) % 2 == 0 else names[::-1]:
                op.work_dir = work_dirs[name]
                start = time.perf_counter()
                fn(batch)
                best[name][i] = min(best[name][i], time.perf_counter() - start)
    q, d = sum(best["quarantine"]), sum(best["data-juicer"])
    return {"quarantine_s": q, "data_juicer_s": d, "ratio": q / d}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    table = make_rows(args.rows)
    with tempfile.TemporaryDirectory(prefix="dje-bench-quarantine-") as tmp:
        layout = JobLayout(Path(tmp) / "job")
        active = layout.attempt_dir("part-00000-of-00001", "a1") / "work"
        write_context(active, BatchingContext(str(layout.root), "part-00000-of-00001", "a1", [StageRef("s", "f")]))
        plain = Path(tmp) / "plain-work"
        plain.mkdir()
        work_dirs = {"quarantine": str(active), "data-juicer": str(plain)}

        blocks = [table.slice(i, 1000) for i in range(0, args.rows, 1000)]
        mapper = OPERATORS.modules["whitespace_normalization_mapper"](skip_op_error=True)
        assert isinstance(mapper.process, QuarantinedBatch)
        results = {
            "whitespace_normalization_mapper, 1,000-row batches": compare(
                mapper, mapper.process, blocks, work_dirs, args.rounds
            )
        }

        length = OPERATORS.modules["text_length_filter"](min_len=10, max_len=10000, skip_op_error=True)
        stats_table = table.append_column("__dj__stats__", [[{} for _ in range(args.rows)]])
        stats_blocks = [stats_table.slice(i, 1000) for i in range(0, args.rows, 1000)]
        results["text_length_filter stats, 1,000-row batches"] = compare(
            length, length.compute_stats, stats_blocks, work_dirs, args.rounds
        )

        # The keep decision gets a dict: Data-Juicer's filter_batch converts the block.
        stats_dicts = [length.compute_stats(block) for block in stats_blocks]
        results["text_length_filter keep decision, 1,000-row dict batches"] = compare(
            length, lambda batch: list(length.process(batch)), stats_dicts, work_dirs, args.rounds
        )

        strip = StripMapper(skip_op_error=True)
        assert isinstance(strip.process, QuarantinedRow)
        one_row = [table.slice(i, 1) for i in range(args.rows)]
        results["a per-row Mapper, one-row batches (worst case)"] = compare(
            strip, strip.process, one_row, work_dirs, args.rounds
        )

    print(
        f"rows {args.rows:,}, rounds {args.rounds} "
        "(per batch the best of the rounds; ratio = quarantine / Data-Juicer's wrapper)"
    )
    for name, result in results.items():
        print(
            f"  {name}: quarantine {result['quarantine_s']:.3f} s, Data-Juicer {result['data_juicer_s']:.3f} s, "
            f"ratio {result['ratio']:.3f}"
        )


if __name__ == "__main__":
    main()
