"""Deduplication across shards: `elastic_sharded` keeps exactly the rows Data-Juicer's `default`
executor keeps, through the real `dj-process`, for any number of shards.

The corpus is built to make a shard-wise deduplication go wrong: copies far apart (in other shards),
case and punctuation variants, near copies, short and empty documents (every document shorter than
MinHash's window falls in one cluster).  The oracle is the default executor on the same recipe and
input: the same rows, in the same order, with the same values; and the merged file's bytes are the
same for every `num_shards`.
"""

from __future__ import annotations

import importlib.util
import random
import string
from pathlib import Path

import pytest

from .conftest import read_jsonl
from .test_parity import run_both

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu", "nu"]
# small bands so that near copies collide often; Data-Juicer's defaults are 256 permutations (25 x 10)
MINHASH = {"window_size": 3, "num_permutations": 32, "num_bands": 8, "num_rows_per_band": 4}
HAS_SIMHASH = importlib.util.find_spec("simhash") is not None


def corpus(rows: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    texts: list[str] = []
    for _ in range(rows):
        kind = rng.choice(["new", "new", "copy", "case", "punct", "near", "short", "empty"])
        if kind == "new" or (not texts and kind in ("copy", "case", "punct", "near")):
            texts.append(" ".join(rng.choices(WORDS, k=rng.randint(4, 14))))
        elif kind == "short":
            texts.append(" ".join(rng.choices(WORDS, k=rng.randint(1, 2))))
        elif kind == "empty":
            texts.append(rng.choice(["", " "]))
        else:
            source = rng.choice(texts)
            if kind == "copy":
                texts.append(source)
            elif kind == "case":
                texts.append(source.upper() if rng.random() < 0.5 else source.title())
            elif kind == "punct":
                texts.append(source.replace(" ", rng.choice([", ", ". ", " - "])) + "!")
            else:
                words = source.split() or ["x"]
                words[rng.randrange(len(words))] = rng.choice(WORDS + list(string.ascii_lowercase))
                texts.append(" ".join(words))
    return [{"id": i, "text": text, "n": i * 1.5 if i % 3 else i} for i, text in enumerate(texts)]


def write_rows(path: Path, rows: list[dict]) -> Path:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def assert_same_rows(rows: list[dict], default: Path, elastic: Path) -> list[int]:
    ours, theirs = read_jsonl(elastic), read_jsonl(default)
    kept = [row["id"] for row in ours]
    assert kept == [row["id"] for row in theirs], "the rows the default executor keeps, in its order"
    assert 0 < len(ours) < len(rows), "the recipe both keeps and drops rows"
    by_id = {row["id"]: row for row in rows}
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine["text"] == reference["text"], (mine, reference)
        assert mine["n"] == by_id[mine["id"]]["n"] and type(mine["n"]) is type(by_id[mine["id"]]["n"])
        assert not any(key.startswith("__dj") for key in mine), mine  # hash columns leave, as the exporter drops them
    return kept


TWO_STAGES = [
    {"whitespace_normalization_mapper": None},
    {"document_deduplicator": {"lowercase": True, "ignore_non_character": True}},
    {"words_num_filter": {"min_num": 1, "lang": "en", "tokenization": False}},
    {"document_minhash_deduplicator": MINHASH},
    {"punctuation_normalization_mapper": None},
]


def test_two_deduplicators_with_operators_between_keep_the_default_executors_rows(tmp_path):
    """Seven shards: copies, variants and short documents fall in other shards than their first copy.
    (Each deduplicator for 1, 2, 7 shards and one row per shard: the extended tier below.)"""
    rows = corpus(160, seed=3)
    data = write_rows(tmp_path / "input.jsonl", rows)
    default, elastic = run_both(tmp_path, "two", data, {"process": TWO_STAGES}, {"num_shards": 7})
    assert_same_rows(rows, default, elastic)


@pytest.mark.extended
def test_the_merged_bytes_are_the_same_for_any_num_shards(tmp_path):
    rows = corpus(160, seed=3)
    data = write_rows(tmp_path / "input.jsonl", rows)
    outputs = {}
    for shards in (7, 1, 2):
        default, elastic = run_both(tmp_path, f"two-{shards}", data, {"process": TWO_STAGES}, {"num_shards": shards})
        assert_same_rows(rows, default, elastic)
        outputs[shards] = elastic.read_bytes()
    assert outputs[7] == outputs[1] == outputs[2], "the same bytes for any num_shards"


@pytest.mark.extended
@pytest.mark.parametrize("shards", [1, 2, 7, "per-row"])
@pytest.mark.parametrize(
    "dedup",
    [
        {"document_deduplicator": {"lowercase": True}},
        {"document_minhash_deduplicator": MINHASH},
        {"document_minhash_deduplicator": None},  # Data-Juicer's defaults (scipy's band choice)
        pytest.param(
            {"document_simhash_deduplicator": {"window_size": 3}},
            marks=pytest.mark.skipif(not HAS_SIMHASH, reason="simhash-pybind is not installed"),
        ),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else str(value),
)
def test_each_deduplicator_keeps_the_default_executors_rows(tmp_path, dedup, shards):
    rows = corpus(24 if shards == "per-row" else 120, seed=11)
    data = write_rows(tmp_path / "input.jsonl", rows)
    num_shards = len(rows) if shards == "per-row" else shards
    process = [{"whitespace_normalization_mapper": None}, dedup]
    default, elastic = run_both(tmp_path, "one", data, {"process": process}, {"num_shards": num_shards})
    assert_same_rows(rows, default, elastic)


@pytest.mark.extended
def test_rows_whose_hashing_raises_are_quarantined_and_the_rest_is_the_default_executors(tmp_path):
    """A null text makes `document_deduplicator`'s `compute_hash` raise (the default executor stops on it):
    under elastic_sharded the row is quarantined (op `elastic_dedup_hash`) and counted, and the output is
    what the default executor writes for the input without it."""
    import json
    import os
    import subprocess

    import yaml

    from .conftest import RAY_CPUS

    rows = corpus(40, seed=5)
    bad = {7, 23}
    with_nulls = [{**row, "text": None} if row["id"] in bad else row for row in rows]
    process = [{"document_deduplicator": {"lowercase": True}}]
    exports = {}
    for executor, data in (("default", [r for r in rows if r["id"] not in bad]), ("elastic_sharded", with_nulls)):
        path = write_rows(tmp_path / executor / "input.jsonl", data)
        export = tmp_path / executor / "merged.jsonl"
        recipe = {"project_name": f"nulls-{executor}", "dataset_path": str(path), "export_path": str(export), "np": 2,
                  "process": process}  # fmt: skip
        if executor == "elastic_sharded":
            recipe["executor_type"] = executor
            recipe["elastic"] = {"job_dir": str(tmp_path / "job"), "ray_num_cpus": RAY_CPUS, "num_shards": 3}
        (tmp_path / executor / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
        proc = subprocess.run(
            ["dj-process", "--config", str(tmp_path / executor / "recipe.yaml")], cwd=tmp_path, capture_output=True,
            text=True, timeout=600, env={k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_JOB")},
        )  # fmt: skip
        assert proc.returncode == 0, f"{executor}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        exports[executor] = export
    assert [r["id"] for r in read_jsonl(exports["elastic_sharded"])] == [
        r["id"] for r in read_jsonl(exports["default"])
    ]
    errors = [
        json.loads(line) for line in (tmp_path / "elastic_sharded" / "merged_errors.jsonl").read_text().splitlines()
    ]
    assert [(e["row_number"], e["op"], e["row"]["text"]) for e in errors] == [
        (i, "elastic_dedup_hash", None) for i in sorted(bad)
    ]
    record = json.loads((tmp_path / "job" / "merge.json").read_bytes())
    assert record["errors_rows"] == len(bad) and record["dedup"][0]["failed"] == len(bad)
