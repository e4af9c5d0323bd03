"""Shard invariance: the merged file's bytes do not depend on ``num_shards``.

Property test over generated rows with tricky values and shard counts from 1 to one row per
shard, through the executor's own pieces on one warm Ray runtime (prepare_job, the worker
loop with the real ShardRunner running Data-Juicer's RayExecutor, merge_job).  Every job is
also checked against the input: values no operator touched come back exactly.

``DJ_ELASTIC_INVARIANCE_EXAMPLES`` raises the number of examples for a deeper local run
(CI runs a few, derandomized, so a failure reproduces).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.execution.shard_runner import ShardRunner
from data_juicer_elastic.execution.stage_identities import compute_stage_identities
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

from ..values import strict_equal
from .conftest import recipe

pytestmark = pytest.mark.ray

EXAMPLES = int(os.environ.get("DJ_ELASTIC_INVARIANCE_EXAMPLES", "3"))
# few examples by default (each runs real Ray shards); fixed when few, so a CI failure reproduces
INVARIANCE_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 3,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
RECIPE = recipe(
    process=[{"whitespace_normalization_mapper": {}}, {"text_length_filter": {"min_len": 4, "max_len": 10000}}]
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 193, -1, 2**53 + 1, 2**63 - 1, -(2**63), 2**70 + 3]),
    st.sampled_from([1e-12, 3.5e-11, 0.43276706790505337, 1e300, -0.0, 2.5, 5e-324]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["2023-04-27T00:00:00", "2024-02-29", "00123", "1e5", "", "漢字 é"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3)
    ),
    max_leaves=6,
)
texts = st.sampled_from(["  hello   world ", "ok", "a  b  c  d", "漢字 テキスト  x", "tab\tsep  row"])
rows = st.lists(
    st.tuples(texts, st.dictionaries(st.sampled_from(["score", "meta", "tags", "extra"]), values, max_size=3)),
    min_size=2,
    max_size=9,
).map(lambda items: [{"id": i, "text": text, **other} for i, (text, other) in enumerate(items)])


def merged_bytes(data: Path, root: Path, shards: int, cache_dir: Path, job_recipe: dict = RECIPE) -> tuple[bytes, ...]:
    job = root / f"job-{shards}"
    request = PrepareRequest(job, data, shards, job_recipe, compute_stage_identities(job_recipe))
    manifest = prepare_job(request).manifest
    runner = ShardRunner(job_recipe, manifest.stage_identities, cache_dir, row_schema=manifest.row_schema)
    summary = run_worker(
        job,
        WorkerIdentity.current(node_id="invariance"),
        runner,
        WorkerSettings(ttl_secs=120, heartbeat_secs=30, max_retries=0, poll_interval_secs=0.5),
    )
    assert summary.complete
    output = root / f"merged-{shards}.jsonl"
    merge_job(job, output)
    stats = output.with_name(f"merged-{shards}_stats.jsonl")
    return output.read_bytes(), stats.read_bytes() if stats.exists() else b""


@INVARIANCE_SETTINGS
@pytest.mark.extended
@given(rows, st.data())
def test_merged_bytes_are_the_same_for_any_num_shards(ray_runtime, cache_dir, tmp_path_factory, batch, data):
    root = tmp_path_factory.mktemp("invariance")
    source = root / "input.jsonl"
    source.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in batch), encoding="utf-8")
    counts = data.draw(st.lists(st.integers(2, len(batch)), min_size=1, max_size=2, unique=True))
    reference, reference_stats = merged_bytes(source, root, 1, cache_dir)
    for shards in counts:
        assert merged_bytes(source, root, shards, cache_dir) == (reference, reference_stats), f"{shards} shards"

    out = [json.loads(line) for line in reference.splitlines()]
    kept = {row["id"]: row for row in batch if row["text"] != "ok"}  # the one text under min_len after the mapper
    assert [row["id"] for row in out] == list(kept), "rows and order"
    for row in out:
        assert strict_equal(
            {k: v for k, v in row.items() if k != "text"}, {k: v for k, v in kept[row["id"]].items() if k != "text"}
        )


# An operator that adds, deletes and re-types (nested) keys of some rows (the rows it picks by id).
edits = st.lists(
    st.tuples(
        st.sampled_from(["meta.src", "meta.deep.x", "meta", "tag", "extra.a"]),
        st.sampled_from(["delete", "set"]),
        st.sampled_from([None, "s", 7, {}, {"k": "v"}, {"z": 1, "a": None}, [1, 2], ["x"]]),
        st.integers(1, 3),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=3,
)
nested_rows = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "meta": st.fixed_dictionaries({}, optional={"src": st.text(max_size=3), "deep": st.just({"x": "d"})}),
            "tag": st.sampled_from(["t", ""]),
        },
    ),
    min_size=2,
    max_size=6,
).map(lambda items: [{"id": i, "text": f"row {i}", **item} for i, item in enumerate(items)])


@INVARIANCE_SETTINGS
@pytest.mark.extended
@given(nested_rows, edits, st.data())
def test_an_operator_reshaping_keys_gives_the_same_bytes_for_any_num_shards(
    ray_runtime, cache_dir, tmp_path_factory, batch, edit_list, data
):
    root = tmp_path_factory.mktemp("reshape")
    source = root / "input.jsonl"
    source.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in batch), encoding="utf-8")
    job_recipe = recipe(process=[{"dj_elastic_test_reshape_mapper": {"edits": json.dumps(edit_list)}}])
    reference = merged_bytes(source, root, 1, cache_dir, job_recipe)
    for shards in data.draw(st.lists(st.integers(2, len(batch)), min_size=1, max_size=2, unique=True)):
        assert merged_bytes(source, root, shards, cache_dir, job_recipe) == reference, f"{shards} shards"
