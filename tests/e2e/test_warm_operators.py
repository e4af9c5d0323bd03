"""Warm operators across shards: through the real `dj-elastic` commands, with real Ray.

One worker runs 8 shards of a recipe with two heavy-``__init__`` operators (``bench_heavy_load_mapper``
from ``benchmarks/ops/warm_ops.py``, which records each load with its process id): one in
task mode, one in actor mode (``ray_execution_mode: actor``, what ``accelerator: cuda``
selects on a GPU node).  Each must be loaded once per process for the whole job, and the
output must be the input (the operators pass rows through: the input file is the oracle).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from .conftest import REPO, assert_ok, elastic_recipe, run

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

SHARDS = 8
ROWS_PER_SHARD = 12
WARM_OPS = REPO / "benchmarks" / "ops" / "warm_ops.py"


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.extended
def test_eight_shards_load_each_operator_once_per_process(tmp_path):
    data = tmp_path / "input.jsonl"
    with open(data, "w", encoding="utf-8") as handle:
        for i in range(SHARDS * ROWS_PER_SHARD):
            row = {"id": i, "text": f"row {i} héllo \u3000 wörld", "n": i * 1.5, "tags": ["a", str(i)]}
            # compact and unescaped: how the row writer writes rows it did not change
            handle.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    task_log, actor_log = tmp_path / "task-op.jsonl", tmp_path / "actor-op.jsonl"
    common = {"load_secs": 0.2, "batch_secs": 0.0, "batch_size": 4, "num_proc": 1}
    process = [
        {"bench_heavy_load_mapper": {**common, "record_path": str(task_log)}},
        {"bench_heavy_load_mapper": {**common, "record_path": str(actor_log), "ray_execution_mode": "actor"}},
    ]
    recipe = elastic_recipe(tmp_path, data, num_shards=SHARDS, process=process, ray_num_cpus=2)
    recipe.write_text(recipe.read_text() + f"custom_operator_paths: ['{WARM_OPS}']\n")
    assert_ok(run(["dj-elastic", "prepare", "--config", str(recipe)], cwd=tmp_path))
    for log in (task_log, actor_log):  # prepare built the operators once to compute stage identities
        log.unlink(missing_ok=True)

    job = tmp_path / "job" / "job"
    env = {"DJ_ELASTIC_NODE_ID": "solo", "DJ_ELASTIC_WARM_OPERATORS": "1"}
    worker = run(["dj-elastic", "worker", "--job-dir", str(job), "--no-wait"], cwd=tmp_path, env=env)
    assert_ok(worker)
    assert len(list((job / "done").iterdir())) == SHARDS
    last = (worker.stdout + worker.stderr).strip().splitlines()[-1]
    assert (
        "the job is complete. Workers do not write the export: `dj-elastic merge --job-dir job/job` merges it"
        " into job/merged.jsonl (so does a dj-process run of the recipe)" in last
    ), last

    task_events, actor_events = _events(task_log), _events(actor_log)
    task_loads = Counter(e["pid"] for e in task_events if e["event"] == "load")
    actor_loads = Counter(e["pid"] for e in actor_events if e["event"] == "load")
    # Task mode: built once in the worker process (stage identities and all 8 shards share it);
    # its Ray tasks receive the built instance.  Unwarmed: 9 loads.
    assert list(task_loads.values()) == [1], task_loads
    # Actor mode: once in the worker process and once in the one warm actor.  Unwarmed: 9 + 8.
    assert sorted(actor_loads.values()) == [1, 1], actor_loads
    actor_batch_pids = {e["pid"] for e in actor_events if e["event"] == "batch"}
    assert len(actor_batch_pids) == 1 and actor_batch_pids <= set(actor_loads), actor_batch_pids
    assert sum(e["rows"] for e in actor_events if e["event"] == "batch") == SHARDS * ROWS_PER_SHARD

    # without --output: the recipe's export_path, as the worker said
    assert_ok(run(["dj-elastic", "merge", "--job-dir", str(job)], cwd=tmp_path))
    assert (tmp_path / "job" / "merged.jsonl").read_bytes() == data.read_bytes()
