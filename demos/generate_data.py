"""Generate a deterministic text JSONL dataset for demos, tests and benchmarks.

Rows mix clean sentences, runs of odd whitespace (work for
whitespace_normalization_mapper) and very short texts (dropped by
text_length_filter), so the demo recipe both rewrites and filters.

    python demos/generate_data.py --rows 200000 --output /tmp/big.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

_WORDS = (
    "data juicer elastic shard worker claim lease merge ray node storage "
    "recipe mapper filter text sample quality batch memory order stable "
    "process export manifest heartbeat fencing token publish verify"
).split()
_ODD_SPACES = ["  ", "\t", "\u3000", "\u00a0", " \u2009 "]


def make_row(rng: random.Random, index: int) -> dict:
    kind = rng.random()
    if kind < 0.1:
        text = rng.choice(_WORDS)  # too short: filtered out by min_len 10
    else:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 60))]
        if kind < 0.5:
            words = [w + rng.choice(_ODD_SPACES) for w in words]
        text = " ".join(words)
    return {"id": index, "text": text, "meta": {"source": f"gen-{index % 7}"}}


def write_dataset(path: Path, rows: int, seed: int = 42) -> Path:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for index in range(rows):
            out.write(json.dumps(make_row(rng, index), ensure_ascii=False) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    write_dataset(args.output, args.rows, args.seed)


if __name__ == "__main__":
    main()
