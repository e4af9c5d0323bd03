"""A corpus built to catch every way a value can change between input and output.

Rows have a unique ``id`` (the join key for comparisons) and a ``text`` the recipes'
operators work on; every other value is one no operator touches, chosen to be what JSON
pipelines lose: doubles that need 17 digits, tiny and huge magnitudes, ``-0.0``, integers
beyond 2**53 within int64, strings that look like dates or numbers, booleans and nulls,
keys present only in a region of the input, nested objects whose keys vary, lists of
mixed length, non-ASCII text and a column mixing JSON types.  Written as a directory of
two files (a directory input).  Integers beyond int64 are apart (``huge_rows``): with them
Data-Juicer's default executor cannot load a file that also mixes JSON types.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ROWS_PER_FILE = (170, 130)
WORDS = ["data", "juicer", "élan", "naïve", "漢字", "テキスト", "ok", "the", "mail@example.com", "https://x.y/z"]


def corpus_rows(seed: int = 12) -> list[list[dict]]:
    rng = random.Random(seed)
    files: list[list[dict]] = []
    n = 0
    for count in ROWS_PER_FILE:
        rows = []
        for _ in range(count):
            words = [rng.choice(WORDS) for _ in range(rng.randint(1, 30))]
            row: dict = {
                "id": n,
                "text": ("  " if n % 3 == 0 else "") + "  ".join(words) + ("\t!!" if n % 5 == 0 else ""),
                "score": [1e-12, 3.5e-11, 0.43276706790505337, 193, 2.5, 1e300, -0.0, 5e-324][n % 8],
                "exact": rng.random() * 10 ** rng.randint(-300, 300),
                "big": 2**53 + n if n % 2 else -(2**62) - n,
                "date": "2023-04-27T00:00:00" if n % 4 else "2024-02-29",
                "numstr": ["00123", "1e5", "-0", "NaN"][n % 4],
                "flag": [True, False, None][n % 3],
                "maybe": None if n % 5 == 0 else "x",
                "meta": {"src": "a" if n % 7 else "b", "n": n},
                "lst": list(range(n % 4)),
            }
            if 40 <= n < 80:
                row["region"] = {"k": n, "sub": {"deep": "v", "f": 0.1}}
            if 100 <= n < 140:
                row["meta"]["extra"] = {"x": "y", "z": [1, 2.5]}
            if n % 11 == 0:
                row["mix"] = [1, "one", {"o": 1}, [1], 2.5, True][n % 6]
            rows.append(row)
            n += 1
        files.append(rows)
    return files


def write_corpus(directory: Path) -> list[dict]:
    """``directory/a.jsonl`` and ``directory/more/b.jsonl``; returns every row in file order."""
    files = corpus_rows()
    paths = [directory / "a.jsonl", directory / "more" / "b.jsonl"]
    for path, rows in zip(paths, files, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return [row for rows in files for row in rows]


def huge_rows(count: int = 60) -> list[dict]:
    """Integers beyond int64 in one column (with ordinary ones), nothing mixed."""
    return [{"id": i, "text": f"row {i}  text", "huge": 2**70 + i if i % 7 == 0 else i} for i in range(count)]
