"""ShardConfigs: a recipe parsed once and re-based per attempt equals a fresh Data-Juicer parse, field by field."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_juicer_elastic.compat.dj_ops_internals import no_ray_start
from data_juicer_elastic.execution.stage_identities import ShardConfigs, load_dj_config, ray_job_env

from .conftest import recipe, write_shard


def _overrides(root: Path, shard: Path, attempt: str) -> dict:
    """What ShardRunner passes for one attempt (attempt_dir = root/attempts/<shard>/<attempt>)."""
    attempt_dir = root / "attempts" / shard.stem / attempt
    return {
        "dataset_path": str(shard),
        "export_path": str(attempt_dir / "ray-output"),
        "export_type": "jsonl",
        "keep_stats_in_res_ds": True,
        "work_dir": str(attempt_dir / "work"),
        "job_id": attempt,
        "ray_address": "192.0.2.1:6379",
    }


def _fields(cfg) -> dict:
    return cfg.as_dict() if hasattr(cfg, "as_dict") else dict(vars(cfg))


def _assert_same(rebased, fresh) -> None:
    ours, theirs = _fields(rebased), _fields(fresh)
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert ours[key] == theirs[key], f"field {key!r}: re-based {ours[key]!r} != fresh {theirs[key]!r}"
    assert rebased == fresh
    assert rebased.config[0] == fresh.config[0] and str(rebased.config[0]) == str(fresh.config[0])


RECIPES = {
    "demo": recipe(),
    "keys-and-stats-options": recipe(
        text_keys="content",
        skip_op_error=False,
        keep_stats_in_res_ds=True,
        process=[
            {"whitespace_normalization_mapper": None},
            {"text_length_filter": {"min_len": 5, "max_len": 50}},
            {"whitespace_normalization_mapper": {"text_key": "other"}},  # a repeated op with its own key
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_rebased_attempts_equal_fresh_parses(name, tmp_path):
    rec = RECIPES[name]
    shards = [write_shard(tmp_path / "shards" / f"part-{i:05d}.jsonl", 3) for i in range(2)]
    attempts = [(shards[0], "a1"), (shards[1], "a1"), (shards[0], "a2"), (shards[1], "20261129T1-node-9-abc")]
    configs = ShardConfigs(rec)
    with ray_job_env(), no_ray_start():
        for shard, attempt in attempts:
            overrides = _overrides(tmp_path / "ours", shard, attempt)
            rebased = configs.load(overrides, tmp_path / "ours" / "attempts" / shard.stem / attempt / "recipe.yaml")
            fresh_overrides = _overrides(tmp_path / "ours", shard, attempt)
            fresh_path = tmp_path / "ours" / "attempts" / shard.stem / attempt / "recipe.yaml"
            fresh = load_dj_config(rec, fresh_overrides, fresh_path)  # the same file, parsed afresh
            _assert_same(rebased, fresh)
            # operators carry the attempt's own work_dir: the adaptive-batching context lives there
            assert {args["work_dir"] for op in rebased.process for args in op.values()} == {fresh.work_dir}
            assert fresh.work_dir == str(tmp_path / "ours" / "attempts" / shard.stem / attempt / "work" / attempt)
    assert configs.parses == 1


def test_rebased_configs_do_not_share_mutable_state(tmp_path):
    shard = write_shard(tmp_path / "s.jsonl", 3)
    configs = ShardConfigs(recipe())
    with ray_job_env(), no_ray_start():
        first = configs.load(_overrides(tmp_path, shard, "a1"), tmp_path / "a1.yaml")
        first.process[0]["whitespace_normalization_mapper"]["text_key"] = "mutated by RayExecutor"
        first._resolved_stage_identities = {"stages": []}
        second = configs.load(_overrides(tmp_path, shard, "a2"), tmp_path / "a2.yaml")
    assert second.process[0]["whitespace_normalization_mapper"]["text_key"] == "text"
    assert not hasattr(second, "_resolved_stage_identities")


def test_a_field_left_stale_falls_back_to_parsing(tmp_path, monkeypatch):
    """A Data-Juicer that derives one more field from work_dir must not leak attempt 1's path into attempt 2."""
    import data_juicer.config.config as dj_config

    original = dj_config.resolve_job_directories

    def resolve_and_derive_more(cfg):
        cfg = original(cfg)
        if not hasattr(cfg, "extra_dir"):  # a new field, derived only at parse time
            cfg.extra_dir = cfg.work_dir + "/extra"
        return cfg

    monkeypatch.setattr(dj_config, "resolve_job_directories", resolve_and_derive_more)
    shard = write_shard(tmp_path / "s.jsonl", 3)
    configs = ShardConfigs(recipe())
    with ray_job_env(), no_ray_start():
        configs.load(_overrides(tmp_path, shard, "a1"), tmp_path / "a1.yaml")
        second = configs.load(_overrides(tmp_path, shard, "a2"), tmp_path / "a2.yaml")
        third = configs.load(_overrides(tmp_path, shard, "a3"), tmp_path / "a3.yaml")
    assert second.extra_dir == second.work_dir + "/extra" and "/a2/" in second.extra_dir
    assert third.extra_dir == third.work_dir + "/extra"
    assert configs.parses == 3  # attempt 2 was parsed afresh, and every later one too
