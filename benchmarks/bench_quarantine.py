"""Cost of quarantine when nothing fails, as ratios measured in the same run.

Under ``elastic_sharded`` every Mapper's and Filter's ``process`` / ``compute_stats`` is
quarantine's wrapper (``quarantine.collector``) instead of Data-Juicer's: per call it looks up
the operator's attempt context and calls the method; a batch is bisected only when it fails.
This measures that per-call cost on real Data-Juicer operators, called the way Ray Data calls
them (``map_batches`` with ``batch_format="pyarrow"``): two batched built-ins on 1,000-row
batches (``whitespace_normalization_mapper``, ``text_length_filter``'s stats), and the worst
case for a per-call cost, a cheap per-row Mapper (``process_single``: Ray gives non-batched
operators one-row batches, so it is called once per row).  For each operator the same instance is timed with its
``work_dir`` pointing at an attempt context (quarantine active) and at an empty directory
(Data-Juicer's own wrapper runs), interleaved round by round; the result is the ratio of the
best round times (quarantine / Data-Juicer): on a shared, loaded machine the fastest of many
rounds is the one least disturbed, and both variants get the same chances.

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


def time_calls(fn, batches: list) -> float:
    start = time.perf_counter()
    for batch in batches:
        fn(batch)
    return time.perf_counter() - start


def compare(op, fn, batches: list, work_dirs: dict[str, str], rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"quarantine": [], "data-juicer": []}
    for r in range(rounds):
        order = ["quarantine", "data-juicer"] if r % 2 == 0 else ["data-juicer", "quarantine"]
        for name in order:
            op.work_dir = work_dirs[name]
            times[name].append(time_calls(fn, batches))
    q, d = min(times["quarantine"]), min(times["data-juicer"])
    return {"quarantine_s": q, "data_juicer_s": d, "ratio": q / d}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=9)
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

        strip = StripMapper(skip_op_error=True)
        assert isinstance(strip.process, QuarantinedRow)
        one_row = [table.slice(i, 1) for i in range(args.rows)]
        results["a per-row Mapper, one-row batches (worst case)"] = compare(
            strip, strip.process, one_row, work_dirs, args.rounds
        )

    print(f"rows {args.rows:,}, rounds {args.rounds} (best rounds; ratio = quarantine / Data-Juicer's wrapper)")
    for name, result in results.items():
        print(
            f"  {name}: quarantine {result['quarantine_s']:.3f} s, Data-Juicer {result['data_juicer_s']:.3f} s, "
            f"ratio {result['ratio']:.3f}"
        )


if __name__ == "__main__":
    main()
