"""Parity: `elastic_sharded` against Data-Juicer's `default` executor and against the input itself.

Both executors run the same recipe on the same corpus (``parity_corpus``) through the real
`dj-process`, side by side.  Asserted for every recipe:

* the rows, their order and every value an operator made (``text``, the per-row stats) are
  the default executor's;
* every other value is exactly the input's: same keys present or absent, same JSON types,
  doubles bit for bit, integers exact; the oracle is the input, not the default executor,
  which itself rounds doubles to 10 significant digits, turns ``193`` into ``193.0``, reads
  ``"2024-02-29"`` as a timestamp and fills absent keys with null (docs/lossless.md).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from ..values import strict_equal
from .conftest import OPS_DIR, RAY_CPUS, read_jsonl
from .parity_corpus import huge_rows, write_corpus

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

STATS, META = "__dj__stats__", "__dj__meta__"
MAPPERS = [
    {"whitespace_normalization_mapper": None},
    {"punctuation_normalization_mapper": None},
    {"clean_email_mapper": None},
    {"clean_links_mapper": None},
    {"fix_unicode_mapper": None},
    {"remove_long_words_mapper": {"min_len": 1, "max_len": 20}},
]
FILTERS = [
    {"alphanumeric_filter": {"tokenization": False, "min_ratio": 0.1}},
    {"character_repetition_filter": {"rep_len": 5, "min_ratio": 0.0, "max_ratio": 0.9}},
    {"special_characters_filter": {"min_ratio": 0.0, "max_ratio": 0.5}},
    {"maximum_line_length_filter": {"min_len": 5}},
    # operators that read other fields: they must see the same values under both executors
    {"specified_numeric_field_filter": {"field_key": "id", "min_value": 5, "max_value": 290}},
    {"specified_field_filter": {"field_key": "meta.src", "target_value": ["a"]}},
    {"words_num_filter": {"min_num": 2, "lang": "en", "tokenization": False}},
]


def close(a, b) -> bool:
    """Operator-made values: equal, doubles up to the default executor's 10 significant digits."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)
    return a == b


def run_both(tmp: Path, name: str, dataset: Path, fields: dict, elastic: dict) -> tuple[Path, Path]:
    """`dj-process` with the default executor and with elastic_sharded at once; their export paths."""
    exports, procs = {}, {}
    for executor in ("default", "elastic_sharded"):
        export = tmp / name / executor / "merged.jsonl"
        recipe = {"project_name": f"parity-{name}", "dataset_path": str(dataset), "export_path": str(export), "np": 2}
        recipe.update(fields)
        if executor == "elastic_sharded":
            recipe["executor_type"] = executor
            recipe["elastic"] = {"job_dir": str(tmp / name / "job"), "ray_num_cpus": RAY_CPUS, **elastic}
        path = tmp / name / f"{executor}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        exports[executor] = export
        procs[executor] = subprocess.Popen(
            ["dj-process", "--config", str(path)],
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_JOB")},
        )
    for executor, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{executor} exited {proc.returncode}:\n{out[-4000:]}"
    return exports["default"], exports["elastic_sharded"]


def assert_parity(inputs: list[dict], default: Path, elastic: Path, changed: set[str], *, stats_inline=False):
    by_id = {row["id"]: row for row in inputs}
    ours, theirs = read_jsonl(elastic), read_jsonl(default)
    assert [r["id"] for r in ours] == [r["id"] for r in theirs], "rows and order: the default executor's"
    assert 0 < len(ours) < len(inputs), "the recipe both keeps and drops rows"
    made = changed | ({STATS, META} if stats_inline else set())
    for mine, reference in zip(ours, theirs, strict=True):
        source = by_id[mine["id"]]
        for key in made & set(reference):
            assert close(mine[key], reference[key]), (key, mine[key], reference[key])
        untouched = {k: v for k, v in mine.items() if k not in made}
        expected = {k: v for k, v in source.items() if k not in made}
        assert strict_equal(untouched, expected), f"row {mine['id']}: {untouched} != input {expected}"
    if not stats_inline:  # Data-Juicer's layout: stats beside the export, one line per row, in order
        stats = elastic.with_name("merged_stats.jsonl")
        reference_stats = read_jsonl(default.with_name("merged_stats.jsonl"))
        assert all(STATS not in row for row in ours)
        assert len(read_jsonl(stats)) == len(ours) == len(reference_stats)
        for mine, reference in zip(read_jsonl(stats), reference_stats, strict=True):
            assert close(mine, reference), (mine, reference)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[dict]]:
    directory = tmp_path_factory.mktemp("corpus") / "data"
    return directory, write_corpus(directory)


def test_mappers_and_filters_on_a_directory_match_the_default_executor_and_keep_the_input(corpus, tmp_path):
    """13 built-in operators; directory input read in the default executor's file order."""
    directory, rows = corpus
    default, elastic = run_both(
        tmp_path, "ops", directory, {"process": MAPPERS + FILTERS}, {"num_shards": 2, "input_order": "data_juicer"}
    )
    assert_parity(rows, default, elastic, {"text"})
    # what the default executor loses and this executor keeps (docs/lossless.md)
    ours = {r["id"]: r for r in read_jsonl(elastic)}
    theirs = {r["id"]: r for r in read_jsonl(default)}
    row = next(i for i in ours if ours[i]["score"] == 1e-12)
    assert theirs[row]["score"] == 0.0, "pandas' 10-digit doubles in the default executor"
    assert any("region" not in r for r in ours.values()) and all("region" in r for r in theirs.values())


@pytest.mark.extended
def test_a_file_added_to_a_directory_input_while_the_job_runs_is_named_in_the_closing_summary(tmp_path):
    """The plan lists the input files once: a file that appears later is not read (the export is the
    planned files' rows, the input itself the oracle), and the closing summary says so; running the job
    again is refused, naming the file."""
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    rows = {
        name: [{"id": i, "text": f"{name} row {i}"} for i in range(start, start + 6)]
        for name, start in (("a.jsonl", 0), ("sub/b.jsonl", 6))
    }
    for name, part in rows.items():
        (data / name).write_text("".join(json.dumps(row) + "\n" for row in part))
    late = data / "sub" / "late.jsonl"
    process = [{"e2e_add_file_mapper": {"path": str(late), "content": '{"id": 99, "text": "late row"}\n'}}]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "project_name": "late-file",
                "dataset_path": str(data),
                "export_path": str(tmp_path / "out" / "merged.jsonl"),
                "executor_type": "elastic_sharded",
                "np": 1,
                "custom_operator_paths": [str(OPS_DIR / "e2e_ops.py")],
                "elastic": {"job_dir": str(tmp_path / "job"), "num_shards": 2, "ray_num_cpus": RAY_CPUS},
                "process": process,
            },
            sort_keys=False,
        )
    )
    proc = subprocess.run(["dj-process", "--config", str(recipe)], cwd=tmp_path, capture_output=True, text=True)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-4000:]
    assert late.exists(), "the operator added the file while the job ran"
    assert read_jsonl(tmp_path / "out" / "merged.jsonl") == rows["a.jsonl"] + rows["sub/b.jsonl"]
    note = f"1 file(s) added to {data} after planning were not processed (sub/late.jsonl): a new job_dir plans them"
    summary = console[console.index(" done in ") :]
    assert note in summary, console[-3000:]

    again = subprocess.run(["dj-process", "--config", str(recipe)], cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 2, again.stdout[-2000:] + again.stderr[-2000:]
    last = again.stderr.strip().splitlines()[-1]
    assert "InputChangedError" in last and "sub/late.jsonl" in last, last


@pytest.mark.extended
def test_integers_beyond_int64_and_stats_kept_in_the_rows(tmp_path):
    """A single-file input, ``keep_stats_in_res_ds: true``.  Arrow has no integer beyond int64:
    operators see doubles under both executors (the same rows pass a numeric filter on them), the
    default executor also writes doubles, this executor the exact integers."""
    data = tmp_path / "huge.jsonl"
    rows = huge_rows()
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    process = [
        {"specified_numeric_field_filter": {"field_key": "huge", "min_value": 10, "max_value": 2**71}},
        {"text_length_filter": {"min_len": 10, "max_len": 10000}},
    ]
    fields = {"keep_stats_in_res_ds": True, "process": process}
    default, elastic = run_both(tmp_path, "huge", data, fields, {"num_shards": 3})
    assert_parity(rows, default, elastic, set(), stats_inline=True)
    ours, theirs = read_jsonl(elastic), read_jsonl(default)
    assert all(STATS in row for row in ours)
    assert any(isinstance(r["huge"], float) and r["huge"] != 2**70 + r["id"] for r in theirs)
    assert any(r["huge"] == 2**70 + 7 and type(r["huge"]) is int for r in ours)
