"""The deduplication phases of ShardRunner on the folder's warm Ray runtime, against Data-Juicer's own
operators run the default executor's way (``Mapper.run``, ``Filter.run``, ``Deduplicator.run`` on a
``NestedDataset``): the signature run's rows and keys, the final run's rows, two deduplicators in a row,
and a row-making operator before a deduplicator refused."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.dedup import keys as dedup_keys
from data_juicer_elastic.dedup import simhash_blocks
from data_juicer_elastic.dedup.stages import dedup_stages, drop_column
from data_juicer_elastic.errors import RecipeError
from data_juicer_elastic.execution.dedup_runner import phase_stage_ids
from data_juicer_elastic.execution.row_writer import DROP_MARK
from data_juicer_elastic.execution.shard_runner import ShardRunner
from data_juicer_elastic.execution.stage_identities import compute_stage_identities
from data_juicer_elastic.jobdir.attempts import ShardTask, SignatureTask

from .conftest import file_source, read_jsonl, recipe, schema_of

pytestmark = pytest.mark.ray

CLEAN = [
    {"whitespace_normalization_mapper": {}},
    {"text_length_filter": {"min_len": 12, "max_len": 10000}},
]
MINHASH_SMALL = {"num_permutations": 32, "num_bands": 8, "num_rows_per_band": 4, "window_size": 2}


def corpus(seed: int, rows: int = 120) -> list[dict]:
    """Copies far apart, case variants, near copies (one word changed), short and empty texts."""
    rng = random.Random(seed)
    words = "alpha beta gamma delta epsilon zeta theta iota kappa lambda sigma omega".split()
    base = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(rows // 4)]
    out = []
    for idx in range(rows):
        kind = rng.random()
        text = rng.choice(base)
        if kind < 0.15:
            text = text.upper()
        elif kind < 0.3:
            parts = text.split()
            parts[rng.randrange(len(parts))] = rng.choice(words)
            text = " ".join(parts)
        elif kind < 0.36:
            text = rng.choice(["", "tiny", "  a  b "])
        out.append({"text": "  " + text + "\t", "idx": idx})
    return out


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def default_run(process: list[dict], rows: list[dict], *, reduce_last: bool = True) -> list[dict]:
    """The rows the default executor's operators leave (with their ``__dj__`` columns); the last
    deduplicator, with ``reduce_last`` false, only hashes (``Deduplicator.run(reduce=False)``)."""
    import datasets
    from data_juicer.core.data import NestedDataset
    from data_juicer.ops import load_ops
    from data_juicer.ops.base_op import Deduplicator

    ops = load_ops([{name: {"text_key": "text", **args}} for entry in process for name, args in entry.items()])
    data = NestedDataset(datasets.Dataset.from_list([dict(row) for row in rows]))
    for index, op in enumerate(ops):
        if isinstance(op, Deduplicator):
            data = op.run(data, reduce=reduce_last or index < len(ops) - 1)
        else:
            data = op.run(data)
    return data.to_list()


def task_for(root: Path, path: Path, attempt: str, **extra):
    source = file_source(path, "part-00000-of-00001")
    common = dict(
        shard_id=source.shard_id,
        source=source,
        attempt_dir=root / "attempts" / attempt,
        generation=1,
        attempt_id=attempt,
        input_rows=source.spans[0].rows,
    )
    if "stage" in extra:
        return SignatureTask(shard_index=0, **common, **extra)
    return ShardTask(**common, input_sha256=source.sha256, **extra)


def user_columns(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("__dj")} for row in rows]


def expected_keys(method: str, hashes: list, params: dict) -> np.ndarray:
    if method == "exact":
        return dedup_keys.exact_keys(hashes)
    if method == "minhash":
        return dedup_keys.minhash_keys(hashes)
    values = dedup_keys.simhash_values(hashes)
    return simhash_blocks.simhash_keys(values, params["num_blocks"], params["distance"])


METHODS = {
    "exact": ({"document_deduplicator": {"lowercase": True}}, "__dj__hash"),
    "minhash": ({"document_minhash_deduplicator": MINHASH_SMALL}, "__dj__minhash"),
    "simhash": ({"document_simhash_deduplicator": {"window_size": 2}}, "__dj__simhash"),
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_signatures_and_final_rows_match_the_default_executor(ray_runtime, cache_dir, tmp_path, method):
    if method == "simhash":
        pytest.importorskip("simhash", reason="SimHash needs simhash-pybind (pip install simhash-pybind==0.0.3)")
    dedup, column = METHODS[method]
    rows = corpus(seed=len(method))
    path = write_rows(tmp_path / "shard.jsonl", rows)
    process = [*CLEAN, dedup]
    rec = recipe(process=process)
    runner = ShardRunner(rec, compute_stage_identities(rec), cache_dir, row_schema=schema_of(path))

    found = runner.signatures(task_for(tmp_path, path, "sig", stage=1))
    hashed = default_run(process, rows, reduce_last=False)
    assert found.method == method
    assert found.rows.tolist() == [row["idx"] for row in hashed]  # the rows reaching it, in input order
    assert np.array_equal(found.keys, expected_keys(method, [row[column] for row in hashed], found.params))
    assert found.failed.tolist() == []
    identities = json.loads((tmp_path / "attempts" / "sig" / "stage_identities.json").read_text())
    assert identities["stage_ids"][-1].endswith(":elastic_dedup_hash")
    assert identities["stage_ids"][:-1] == compute_stage_identities(rec)[:-1]

    kept = default_run(process, rows)
    drops = sorted(set(found.rows.tolist()) - {row["idx"] for row in kept})
    assert drops, "the corpus has duplicates"
    output = runner(task_for(tmp_path, path, "final", drops={1: np.asarray(drops, dtype=np.uint64)}))
    assert read_jsonl(output.output_path) == user_columns(kept)


def test_kept_hashes_are_written_as_data_juicer_exports_them(ray_runtime, cache_dir, tmp_path):
    """keep_hashes_in_res_ds: the deduplicator's hash column stays in the output (filled by the drop)."""
    rows = corpus(seed=11, rows=40)
    path = write_rows(tmp_path / "shard.jsonl", rows)
    process = [*CLEAN, {"document_deduplicator": {"ignore_non_character": True}}]
    rec = recipe(process=process, keep_hashes_in_res_ds=True)
    runner = ShardRunner(rec, compute_stage_identities(rec), cache_dir, row_schema=schema_of(path))
    found = runner.signatures(task_for(tmp_path, path, "sig", stage=1))
    kept = default_run(process, rows)
    drops = sorted(set(found.rows.tolist()) - {row["idx"] for row in kept})
    output = runner(task_for(tmp_path, path, "final", drops={1: drops}))
    assert read_jsonl(output.output_path) == [
        {k: v for k, v in row.items() if k in ("text", "idx", "__dj__hash")} for row in kept
    ]


EXAMPLES = int(os.environ.get("DJ_ELASTIC_DEDUP_EXAMPLES", "3"))
# few examples by default (each runs a real Ray shard); fixed when few, so a failure reproduces
DEDUP_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 3,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
AFTER = {"text_length_filter": {"max_len": 60}}
texts = st.one_of(
    st.sampled_from(["", "tiny", "alpha beta gamma delta", "ALPHA BETA GAMMA DELTA", "alpha, beta; gamma delta!"]),
    st.text(alphabet="ab \u00e9\u6d4b\t", max_size=70),
)


@pytest.fixture(scope="module")
def final_runner(ray_runtime, cache_dir, tmp_path_factory):
    """One runner for every example: a deduplicator between a cleaning and a filter after it."""
    root = tmp_path_factory.mktemp("final")
    schema_rows = write_rows(root / "schema.jsonl", [{"text": "a", "idx": 0}])
    rec = recipe(process=[*CLEAN, {"document_deduplicator": {}}, AFTER])
    return ShardRunner(rec, compute_stage_identities(rec), cache_dir, row_schema=schema_of(schema_rows))


@DEDUP_SETTINGS
@given(st.lists(texts, min_size=1, max_size=60), st.data())
def test_the_final_run_writes_exactly_the_rows_not_dropped_and_not_filtered(
    final_runner, tmp_path_factory, batch, data
):
    """Any drop list (not only a deduplicator's): the rows the operators keep but those named, values untouched."""
    root = tmp_path_factory.mktemp("drops")
    rows = [{"text": text, "idx": idx} for idx, text in enumerate(batch)]
    path = write_rows(root / "shard.jsonl", rows)
    drops = sorted(data.draw(st.sets(st.integers(0, len(rows) - 1)), label="drops"))
    output = final_runner(task_for(root, path, "final", drops={1: drops}))
    cleaned = default_run([*CLEAN, AFTER], rows)
    expected = [row for row in user_columns(cleaned) if row["idx"] not in set(drops)]
    written = read_jsonl(output.output_path)
    assert written == expected
    assert not any(DROP_MARK.fullmatch(key) for row in written for key in row)


def test_a_second_exact_deduplicator_reuses_the_first_ones_hash_as_data_juicer_does(ray_runtime, cache_dir, tmp_path):
    rows = corpus(seed=7)
    path = write_rows(tmp_path / "shard.jsonl", rows)
    first, second = {"document_deduplicator": {}}, {"document_deduplicator": {"lowercase": True}}
    between = {"text_length_filter": {"min_len": 20, "max_len": 10000}}
    process = [*CLEAN, first, between, second]
    rec = recipe(process=process)
    runner = ShardRunner(rec, compute_stage_identities(rec), cache_dir, row_schema=schema_of(path))
    stages = dedup_stages(process)
    assert [s.number for s in stages] == [1, 2]

    sig1 = runner.signatures(task_for(tmp_path, path, "sig1", stage=1))
    kept1 = default_run([*CLEAN, first], rows)
    drops1 = sorted(set(sig1.rows.tolist()) - {row["idx"] for row in kept1})
    sig2 = runner.signatures(task_for(tmp_path, path, "sig2", stage=2, drops={1: drops1}))
    hashed2 = default_run(process, rows, reduce_last=False)
    assert sig2.rows.tolist() == [row["idx"] for row in hashed2]
    # the first deduplicator's hash (case kept) is what the second one sees: Data-Juicer's early return
    assert np.array_equal(sig2.keys, dedup_keys.exact_keys([row["__dj__hash"] for row in hashed2]))

    texts = [row["text"].strip().lower() for row in hashed2]
    assert len(set(texts)) < len(texts), "case variants a lowercase hash of its own would join reach it"

    kept2 = default_run(process, rows)
    drops2 = sorted(set(sig2.rows.tolist()) - {row["idx"] for row in kept2})
    assert drops2 == []  # ... and stay, as in Data-Juicer
    output = runner(task_for(tmp_path, path, "final", drops={1: drops1, 2: drops2}))
    assert read_jsonl(output.output_path) == user_columns(kept2)


def test_a_row_making_operator_before_a_deduplicator_is_refused(ray_runtime, cache_dir, tmp_path):
    rows = corpus(seed=3, rows=30)
    path = write_rows(tmp_path / "shard.jsonl", rows)
    rec = recipe(process=[{"dj_elastic_test_repeat_mapper": {"every": 4}}, {"document_deduplicator": {}}])
    runner = ShardRunner(rec, compute_stage_identities(rec), cache_dir, row_schema=schema_of(path))
    with pytest.raises(RecipeError, match=r"process\[1\] document_deduplicator") as caught:
        runner.signatures(task_for(tmp_path, path, "sig", stage=1))
    assert "emitted more rows than it got" in str(caught.value)


def test_a_final_run_without_a_stage_drop_list_is_refused(ray_runtime, cache_dir, tmp_path):
    path = write_rows(tmp_path / "shard.jsonl", corpus(seed=4, rows=10))
    rec = recipe(process=[*CLEAN, {"document_deduplicator": {}}])
    runner = ShardRunner(rec, compute_stage_identities(rec), cache_dir, row_schema=schema_of(path))
    with pytest.raises(Exception, match="no drop list for dedup stage 1"):
        runner(task_for(tmp_path, path, "final"))


def test_phase_identities_are_the_jobs_with_the_deduplicator_replaced_in_place():
    job = ["stage-0000-occ0-aaaa:m", "stage-0001-occ0-bbbb:document_deduplicator", "stage-0002-occ0-cccc:f"]
    final = ["stage-0000-occ0-aaaa:m", "stage-0001-occ0-dddd:elastic_dedup_drop", "stage-0002-occ0-cccc:f"]
    assert phase_stage_ids(job, final, "final") == final
    signature = ["stage-0000-occ0-aaaa:m", "stage-0001-occ0-eeee:elastic_dedup_hash"]
    assert phase_stage_ids(job, signature, "signatures-1") == signature
    moved = ["stage-0000-occ0-dddd:elastic_dedup_drop", "stage-0001-occ0-aaaa:m", "stage-0002-occ0-cccc:f"]
    assert phase_stage_ids(job, moved, "final") == job  # not where the job has a deduplicator: a mismatch
    assert drop_column(3) and DROP_MARK.fullmatch(drop_column(3))


def test_a_row_whose_hashing_raises_is_quarantined_and_listed_as_failed(ray_runtime, cache_dir, tmp_path):
    rows = [{"text": None if idx in (2, 5) else f"text {idx % 3}", "idx": idx} for idx in range(8)]
    path = write_rows(tmp_path / "shard.jsonl", rows)
    rec = recipe(process=[{"document_deduplicator": {}}])
    ids = compute_stage_identities(rec)
    runner = ShardRunner(rec, ids, cache_dir, row_schema=schema_of(path), max_error_rows=2)
    found = runner.signatures(task_for(tmp_path, path, "sig", stage=1))
    assert found.failed.tolist() == [2, 5]
    assert found.rows.tolist() == [0, 1, 3, 4, 6, 7]
    errors = read_jsonl(found.errors_path)
    assert [(e["shard_row"], e["op"]) for e in errors] == [(2, "elastic_dedup_hash"), (5, "elastic_dedup_hash")]


def test_the_deduplicator_gets_the_arguments_the_parser_gives_every_operator_unless_its_own_set_them():
    from data_juicer_elastic.execution.dedup_ops import dedup_args

    inherited = {"text_key": "content", "skip_op_error": False, "work_dir": "/attempt/work", "batch_size": 7}
    assert dedup_args('{"document_deduplicator":{}}', inherited) == (
        "document_deduplicator",
        {"text_key": "content", "skip_op_error": False},
    )
    assert dedup_args({"document_deduplicator": {"text_key": "body", "lowercase": True}}, inherited)[1] == {
        "text_key": "body",
        "skip_op_error": False,
        "lowercase": True,
    }
    with pytest.raises(ValueError, match="not one of the default deduplicators"):
        dedup_args({"ray_bts_minhash_cpp_deduplicator": {}}, inherited)


def test_the_drop_operator_drops_the_marked_rows_removes_the_mark_and_fills_the_hash():
    from data_juicer_elastic.execution.dedup_ops import register_dedup_ops

    _, drop = register_dedup_ops()
    op = drop(stage=2, dedup='{"document_deduplicator":{"lowercase":true}}', fill_hash=True, text_key="text")
    out = op.process({"text": ["A", "b", "C"], "idx": [0, 1, 2], drop_column(2): [False, True, False]})
    assert out["idx"] == [0, 2] and drop_column(2) not in out
    assert out["__dj__hash"] == [dedup_keys_md5("a"), dedup_keys_md5("c")]
    plain = drop(stage=2, dedup={"document_deduplicator": {}}, text_key="text")
    assert plain.process({"text": [], "idx": []}) == {"text": [], "idx": []}  # an empty batch may lack the mark
    with pytest.raises(ValueError, match="without its column"):
        plain.process({"text": ["a"], "idx": [0]})


def dedup_keys_md5(text: str) -> str:
    import hashlib

    return hashlib.md5(text.encode()).hexdigest()
