"""Warm actors on the folder's real Ray runtime: reused across shards, rebuilt after a failed shard."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from data_juicer_elastic.errors import ShardExecutionError
from data_juicer_elastic.execution.shard_runner import ShardRunner
from data_juicer_elastic.execution.stage_identities import compute_stage_identities

from .conftest import read_jsonl, recipe, schema_of, write_shard
from .test_shard_runner import make_task

pytestmark = pytest.mark.ray

ROWS = 40


def test_actor_mode_operator_stays_warm_and_is_rebuilt_after_a_failure(ray_runtime, cache_dir, tmp_path):
    record, marker = tmp_path / "record.txt", tmp_path / "failed-once"
    op = {
        "record_path": str(record),
        "fail_idx": ROWS + 5,  # in shard 1: its first attempt fails
        "marker": str(marker),
        "ray_execution_mode": "actor",
        "num_proc": 1,
        "batch_size": 10,
        "skip_op_error": False,
    }
    rec = recipe(process=[{"dj_elastic_test_loads_mapper": op}])
    shards = [write_shard(tmp_path / "shards" / f"s{i}.jsonl", ROWS, tag=f"W{i}", start=i * ROWS) for i in range(3)]
    runner = ShardRunner(rec, compute_stage_identities(rec), cache_dir, row_schema=schema_of(*shards))
    record.unlink(missing_ok=True)  # compute_stage_identities built the operator once
    ids = [f"part-{i:05d}-of-00003" for i in range(3)]
    try:
        first = runner(make_task(tmp_path, shards[0], ids[0]))
        with pytest.raises(ShardExecutionError, match="first attempt at idx"):
            runner(make_task(tmp_path, shards[1], ids[1]))
        retried = runner(make_task(tmp_path, shards[1], ids[1], attempt_id="a2"))
        last = runner(make_task(tmp_path, shards[2], ids[2]))
    finally:
        runner.close()

    for shard, output in zip((shards[0], shards[1], shards[2]), (first, retried, last), strict=True):
        assert read_jsonl(output.output_path) == read_jsonl(shard)  # the operator passes rows through
    lines = [line.split() for line in record.read_text().splitlines()]
    loads = Counter(pid for kind, pid, *_ in lines if kind == "load")
    actor_pids = [pid for pid in loads if int(pid) != os.getpid()]
    # The driver built the operator for shard 0 and again after the failure; so did one warm
    # actor each time: the failed shard's actor was dropped, the retry got a fresh one.
    assert loads[str(os.getpid())] == 2, loads
    assert len(actor_pids) == 2 and all(loads[pid] == 1 for pid in actor_pids), loads
    batches = [(pid, int(idx)) for kind, pid, *rest in lines if kind == "batch" for idx in rest]
    shard2_pids = {pid for pid, idx in batches if idx >= 2 * ROWS}
    retry_pids = {pid for pid, idx in batches if ROWS <= idx < 2 * ROWS}
    assert len(shard2_pids) == 1 and shard2_pids <= retry_pids  # shard 2 ran on the retry's warm actor
    assert runner.warm.actors.created == 2
