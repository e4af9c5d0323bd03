"""End to end through real `dj-process` subprocesses: an OOM-injecting Mapper with `adaptive_batching: true`
produces exactly the rows of a run that never ran out of memory, in order, under the default, ray and
elastic_sharded executors (Ray task and actor modes); a second shard starts from the learned profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from data_juicer_elastic.jobdir.manifest import load_manifest
from tests.e2e.conftest import RAY_CPUS, assert_ok, read_jsonl, read_ray_output, run

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
DEMO = "elastic_oom_demo_mapper"


def demo_op(capacity: int, **extra) -> dict:
    # 32-row outer batches need ~2,500 characters; capacity 600 makes almost every batch OOM first.
    return {DEMO: {"capacity": capacity, "batch_size": 32, "suffix": "#", "torch_errors": False, **extra}}


def recipe(path: Path, **fields) -> Path:
    data = {"project_name": "adaptive-e2e", "np": 1, **fields}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    import sys

    sys.path.insert(0, str(REPO / "demos"))
    from generate_data import write_dataset

    return write_dataset(tmp_path_factory.mktemp("adaptive") / "input.jsonl", rows=160, seed=11)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> list[dict]:
    """A plain default-executor run whose memory never runs out."""
    tmp = tmp_path_factory.mktemp("reference")
    out = tmp / "out.jsonl"
    cfg = recipe(tmp / "r.yaml", dataset_path=str(data), export_path=str(out), process=[demo_op(10**9)])
    assert_ok(run(["dj-process", "--config", str(cfg)], cwd=tmp))
    rows = read_jsonl(out)
    inputs = read_jsonl(data)
    assert [r["id"] for r in rows] == [r["id"] for r in inputs]
    assert all(r["text"] == i["text"] + "#" for r, i in zip(rows, inputs, strict=True))
    return rows


def test_default_executor(data, reference, tmp_path):
    out = tmp_path / "out.jsonl"
    ops = [demo_op(600, adaptive_batching=True)]
    cfg = recipe(tmp_path / "r.yaml", dataset_path=str(data), export_path=str(out), np=2, process=ops)
    assert_ok(run(["dj-process", "--config", str(cfg)], cwd=tmp_path))
    assert read_jsonl(out) == reference

    # without the opt-in the same recipe fails on the first OOM
    cfg = recipe(tmp_path / "off.yaml", dataset_path=str(data), export_path=str(tmp_path / "off.jsonl"), np=1)
    cfg.write_text(cfg.read_text() + yaml.safe_dump({"process": [demo_op(600, skip_op_error=False)]}))
    proc = run(["dj-process", "--config", str(cfg)], cwd=tmp_path)
    assert proc.returncode != 0 and "out of memory" in proc.stdout + proc.stderr


@pytest.mark.extended
@pytest.mark.ray
def test_ray_executor_task_mode(data, reference, tmp_path):
    out = tmp_path / "out"
    cfg = recipe(
        tmp_path / "r.yaml",
        executor_type="ray",
        ray_address="local",
        dataset_path=str(data),
        export_path=str(out),
        process=[demo_op(600, adaptive_batching=True, num_proc=1)],
    )
    assert_ok(run(["dj-process", "--config", str(cfg)], cwd=tmp_path))
    assert read_ray_output(out) == reference


def _actor_job(tmp_path, data, **elastic):
    """A 2-shard elastic job whose one operator runs adaptive batching in actor mode: (job, merged, recipe)."""
    job, merged = tmp_path / "job", tmp_path / "merged.jsonl"
    op = demo_op(600, adaptive_batching=True, ray_execution_mode="actor", num_proc=1)
    cfg = recipe(
        tmp_path / "r.yaml",
        executor_type="elastic_sharded",
        dataset_path=str(data),
        export_path=str(merged),
        # An actor holds its CPU for the whole dataset: the read tasks need a second one.
        elastic={"job_dir": str(job), "num_shards": 2, "ray_num_cpus": RAY_CPUS + 1, **elastic},
        process=[op],
    )
    return job, merged, cfg


@pytest.mark.extended
@pytest.mark.ray
def test_elastic_sharded_actor_mode_and_profile_reuse(data, reference, tmp_path):
    job, merged, cfg = _actor_job(tmp_path, data, max_shards=1)
    # Two sequential workers, one shard each: the second is a new process with a new Ray runtime,
    # so only the job directory's profile can carry what the first learned.
    first = run(["dj-process", "--config", str(cfg)], cwd=tmp_path)
    assert first.returncode in (0, 1), first.stderr[-3000:]
    assert_ok(run(["dj-process", "--config", str(cfg)], cwd=tmp_path))
    assert read_jsonl(merged) == reference

    by_shard, started = [], []
    for shard in ("part-00000-of-00002", "part-00001-of-00002"):
        (attempt,) = (job / "attempts" / shard).iterdir()
        record = json.loads((attempt / "attempt.json").read_text())
        assert record["exit_reason"] == "done" and record["batching"] is not None
        by_shard.append(record["batching"])
        started.append(attempt.name)  # attempt ids begin with their UTC start time
    # The second worker joins a job under way and starts at a random pending shard: order by when they ran.
    summaries = [summary for _, summary in sorted(zip(started, by_shard, strict=True), key=lambda pair: pair[0])]
    assert summaries[0]["ooms"] > 0
    (stage,) = summaries[1]["stages"].values()
    assert stage["seeded_from"] == ["profile"] and stage["first_rows"] < 32
    assert summaries[1]["ooms"] < summaries[0]["ooms"]

    # --all: each done shard's records are read (from the job summary alone its batching is not known)
    status = run(["dj-elastic", "status", "--job-dir", str(job), "--json", "--all"], cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    shards = json.loads(status.stdout)["shards"]
    assert [s["batching"]["ooms"] for s in shards] == [s["ooms"] for s in by_shard]
    text = run(["dj-elastic", "status", "--job-dir", str(job), "--all"], cwd=tmp_path).stdout
    assert "adaptive batching:" in text and "final_batch=" in text


@pytest.mark.extended
@pytest.mark.ray
def test_one_worker_two_shards_on_one_warm_actor(data, reference, tmp_path):
    """The warm actor (docs/warm-operators.md) serves both shards: each attempt's telemetry lands
    in its own attempt, and the second starts from what the same process learned."""
    job, merged, cfg = _actor_job(tmp_path, data)
    assert_ok(run(["dj-process", "--config", str(cfg)], cwd=tmp_path))
    assert read_jsonl(merged) == reference
    runs = []
    for shard in ("part-00000-of-00002", "part-00001-of-00002"):
        (attempt,) = (job / "attempts" / shard).iterdir()
        record = json.loads((attempt / "attempt.json").read_text())
        (stage,) = record["batching"]["stages"].values()
        shard_rows = load_manifest(job).shard(shard).rows
        assert stage["rows_in"] == stage["rows_out"] == shard_rows  # only this attempt's rows
        runs.append((attempt.name, stage, {p.name.rsplit("-", 1)[-1] for p in (attempt / "batching").iterdir()}))
    (_, first, first_pids), (_, second, second_pids) = sorted(runs, key=lambda run: run[0])
    assert first["ooms"] > 0 and first["seeded_from"] == []
    assert second["seeded_from"] == ["process"]  # the same warm actor process, its learned policy
    assert first_pids == second_pids and len(first_pids) == 1


@pytest.mark.parametrize(
    ("name", "args", "setting"),
    [
        ("text_length_filter", {}, "adaptive_batching"),  # not a Mapper
        ("image_blur_mapper", {}, "adaptive_batching"),  # a Mapper without process_batched
        (DEMO, {"batch_size": 4, "num_gpus": 2}, "num_gpus"),  # a multi-GPU actor
    ],
)
def test_a_recipe_and_a_class_with_the_mixin_refuse_a_bad_setting_alike(data, tmp_path, name, args, setting):
    from data_juicer.ops.base_op import OPERATORS

    from data_juicer_elastic.batching import mixin
    from data_juicer_elastic.errors import ConfigError

    with pytest.raises(ConfigError) as built:
        mixin.adaptive_class(OPERATORS.modules[name])(adaptive_batching=True, **args)
    assert built.value.hint and name in built.value.where
    out = tmp_path / "out.jsonl"
    ops = [{"whitespace_normalization_mapper": {}}, {name: {"adaptive_batching": True, **args}}]
    cfg = recipe(tmp_path / "r.yaml", dataset_path=str(data), export_path=str(out), process=ops)
    proc = run(["dj-process", "--config", str(cfg)], cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and not out.exists(), output
    assert f"process[1] {name}.{setting}: {built.value.message} ({built.value.hint})" in output
