"""Shared batch profiles and attempt telemetry: a second shard starts from what the first learned."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("data_juicer")

from data_juicer.ops.base_op import OPERATORS  # noqa: E402

from data_juicer_elastic.batching import runtime  # noqa: E402
from data_juicer_elastic.batching.demo import NAME as DEMO  # noqa: E402
from data_juicer_elastic.jobdir.layout import JobLayout

TEXTS = [f"row {i} " + "y" * (20 + i % 30) for i in range(64)]


def profile(**changes) -> runtime.BatchProfile:
    values = dict(
        stage_key="stage-0000-occ0-abcdef12:x",
        accelerator="cpu",
        cost_model="text",
        max_rows=64,
        safe=100.0,
        failing=150.0,
        successes=3,
        ooms=1,
        updated_at=time.time(),
        writer="test:1",
    )
    values.update(changes)
    return runtime.BatchProfile(**values)


def read(layout, p):
    return runtime.read_profile(layout, p.stage_key, p.accelerator, p.cost_model, p.max_rows)


def test_profile_roundtrip_and_rejections(tmp_path):
    layout = JobLayout(tmp_path)
    good = profile()
    path = runtime.write_profile(layout, good)
    assert path.parent == layout.batch_profiles_dir
    assert read(layout, good) == good
    assert runtime.read_profile(layout, good.stage_key, "NVIDIA H200|139GiB", "text", 64) is None  # other key
    runtime.write_profile(layout, profile(updated_at=time.time() - 3 * 86400))
    assert read(layout, good) is None  # stale
    runtime.write_profile(layout, profile(safe=200.0))
    assert read(layout, good) is None  # safe >= failing: unusable
    path.write_text("{not json")
    assert read(layout, good) is None  # corrupt: ignored, not an error
    path.write_text(json.dumps({"format": "dj-elastic/batch-profile", "version": 99}))
    assert read(layout, good) is None  # a newer format


def test_layout_refuses_non_hash_keys(tmp_path):
    from data_juicer_elastic.errors import JobDirError

    with pytest.raises(JobDirError):
        JobLayout(tmp_path).batch_profile("../escape")


def attempt_op(layout: JobLayout, shard: str, attempt: str, stages):
    attempt_dir = layout.attempt_dir(shard, attempt)
    work_dir = attempt_dir / "work" / attempt
    runtime.write_context(
        work_dir,
        runtime.BatchingContext(job_dir=str(layout.root), shard_id=shard, attempt_id=attempt, stages=stages),
    )
    return OPERATORS.modules[DEMO](
        capacity=400, batch_size=64, adaptive_batching=True, torch_errors=False, work_dir=str(work_dir)
    )


def test_second_shard_starts_from_the_learned_profile(tmp_path):
    layout = JobLayout(tmp_path / "job")
    runtime.reset()
    probe = OPERATORS.modules[DEMO](capacity=400, batch_size=64, adaptive_batching=True, torch_errors=False)
    from data_juicer.core.elasticjuicer.stage_identity import operator_fingerprint

    stages = [runtime.StageRef("stage-0000-occ0-00000000:" + DEMO, operator_fingerprint(probe))]
    first = attempt_op(layout, "part-00000-of-00002", "a1", stages)
    first.process({"text": list(TEXTS)})
    first.process({"text": list(TEXTS)})
    learned = list(layout.batch_profiles_dir.iterdir())
    assert len(learned) == 1
    runtime.reset()  # the next shard runs in another process (another node, a restarted actor)

    second = attempt_op(layout, "part-00001-of-00002", "a2", stages)
    out = second.process({"text": list(TEXTS)})
    assert out["demo_chars"] == [len(t) for t in TEXTS]
    summary = runtime.summarize_attempt(layout.attempt_batching_dir("part-00001-of-00002", "a2"))
    (stage,) = summary["stages"].values()
    assert stage["seeded_from"] == ["profile"]
    assert stage["first_rows"] < 64  # not the configured batch_size
    assert summary["ooms"] == 0
    first_summary = runtime.summarize_attempt(layout.attempt_batching_dir("part-00000-of-00002", "a1"))
    assert first_summary["ooms"] > 0 and list(first_summary["stages"]) == [stages[0].stage_id]


def test_without_context_no_files_are_written(tmp_path):
    runtime.reset()
    op = OPERATORS.modules[DEMO](
        capacity=400, batch_size=64, adaptive_batching=True, torch_errors=False, work_dir=str(tmp_path)
    )
    op.process({"text": list(TEXTS)})
    assert list(tmp_path.iterdir()) == []


def test_corrupt_context_is_ignored(tmp_path):
    runtime.reset()
    (tmp_path / runtime.CONTEXT_FILE).write_text("garbage")
    op = OPERATORS.modules[DEMO](
        capacity=400, batch_size=64, adaptive_batching=True, torch_errors=False, work_dir=str(tmp_path)
    )
    assert op.process({"text": list(TEXTS)})["demo_chars"] == [len(t) for t in TEXTS]


def test_attempt_record_and_status_show_the_summary(tmp_path):
    from data_juicer_elastic.jobdir import attempts
    from data_juicer_elastic.jobdir.records import AttemptRecord

    layout = JobLayout(tmp_path)
    summary = {"ooms": 3, "retries": 4, "terminal_ooms": 0, "skipped_rows": 0, "stages": {"s": {"final_rows": 9}}}
    path = layout.attempt_batching_summary("part-00000-of-00001", "a1")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(summary))
    assert attempts.read_batching_summary(layout, "part-00000-of-00001", "a1") == summary
    record = AttemptRecord(
        shard_id="part-00000-of-00001",
        attempt_id="a1",
        generation=1,
        node_id="n",
        hostname="h",
        boot_id="b",
        pid=1,
        started_at=0.0,
        batching=summary,
    )
    assert AttemptRecord.parse(record.encode(), "x").batching == summary


def test_a_seeded_process_writes_the_profile_only_when_it_learns_something(tmp_path):
    layout = JobLayout(tmp_path / "job")
    runtime.reset()
    probe = OPERATORS.modules[DEMO](capacity=400, batch_size=64, adaptive_batching=True, torch_errors=False)
    from data_juicer.core.elasticjuicer.stage_identity import operator_fingerprint

    stages = [runtime.StageRef("stage-0000-occ0-00000000:" + DEMO, operator_fingerprint(probe))]
    seed = profile(stage_key=stages[0].stage_id, safe=100.0, failing=300.0)
    path = runtime.write_profile(layout, seed)
    written = path.read_bytes()
    op = attempt_op(layout, "part-00000-of-00001", "a1", stages)
    for _ in range(3):  # each call fits the seeded safe size in one slice: nothing new
        assert op.process({"text": ["short", "rows"]})["demo_chars"] == [5, 4]
    assert path.read_bytes() == written and list(layout.batch_profiles_dir.iterdir()) == [path]
    op.process({"text": list(TEXTS)})  # budget-bound slices grow past the seeded safe size
    learned = read(layout, seed)
    assert learned.writer != seed.writer and learned.safe > seed.safe and learned.failing == seed.failing
