"""What the row schema costs prepare: observing each row's JSON types vs parsing it.

Prepare parses every input row anyway (to validate it); since the lossless writer and row schema
were added it also joins the row's types into the job's row schema (``rows/row_schema.py``).
This measures both on the same rows in one process, alternating, and reports the ratio: the
schema's share of the per-row work prepare does in Python.  Two generated corpora: flat rows
(id, text) and nested rows (a ``meta`` object with a list and a nested object, a key absent in
10% of rows).

    python benchmarks/bench_row_schema.py --rows 50000 --repeat 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import orjson

from data_juicer_elastic.rows.jsonl import strict_loads
from data_juicer_elastic.rows.row_schema import RowSchema


def flat_rows(n: int, rng: random.Random) -> list[bytes]:
    words = [f"w{i}" for i in range(5000)]
    return [orjson.dumps({"id": i, "text": " ".join(rng.choices(words, k=rng.randrange(20, 120)))}) for i in range(n)]


def nested_rows(n: int, rng: random.Random) -> list[bytes]:
    words = [f"w{i}" for i in range(5000)]
    out = []
    for i in range(n):
        row = {
            "id": i,
            "text": " ".join(rng.choices(words, k=rng.randrange(20, 120))),
            "meta": {
                "src": rng.choice("abc"),
                "score": rng.random(),
                "tags": [rng.randrange(100) for _ in range(rng.randrange(0, 5))],
                "date": f"2024-02-{rng.randrange(1, 29):02d}",
                "nested": {"x": rng.random(), "y": None if rng.random() < 0.3 else rng.randrange(10**6)},
            },
            "lang": "en",
        }
        if rng.random() < 0.1:
            del row["lang"]
        out.append(orjson.dumps(row))
    return out


def measure(lines: list[bytes], repeat: int) -> tuple[float, float]:
    """Median CPU microseconds per row of (parse, observe)."""
    parse, observe = [], []
    for _ in range(repeat):
        t0 = time.process_time()
        rows = [strict_loads(line) for line in lines]
        t1 = time.process_time()
        RowSchema().observe_all(rows)
        t2 = time.process_time()
        parse.append((t1 - t0) / len(lines) * 1e6)
        observe.append((t2 - t1) / len(lines) * 1e6)
    return statistics.median(parse), statistics.median(observe)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(7)
    with open("/proc/loadavg") as handle:
        print(f"load average: {handle.read().split()[:3]}")
    for name, make in (("flat", flat_rows), ("nested", nested_rows)):
        parse, observe = measure(make(args.rows, rng), args.repeat)
        print(f"{name:6}: parse {parse:.2f} us/row, observe {observe:.2f} us/row, observe/parse {observe / parse:.2f}")


if __name__ == "__main__":
    main()
