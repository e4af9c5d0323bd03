"""build_shard_recipe: contents, determinism, cwd independence, validity for executor_type ray."""

from __future__ import annotations

import json

import pytest
import yaml

from data_juicer_elastic.errors import RecipeError
from data_juicer_elastic.integration.recipe import build_shard_recipe, index_key, media_keys, recipe_hash
from tests.integration.conftest import elastic_recipe

CUSTOM_OP = """
from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("{name}")
class UpperMapper(Mapper):
    def process_single(self, sample):
        sample[self.text_key] = sample[self.text_key].upper()
        return sample
"""


def parse(recipe_path, *extra):
    from data_juicer.config import init_configs

    return init_configs(["--config", str(recipe_path), *extra], load_configs_only=True)


@pytest.fixture
def cfg(tmp_path, dataset, write_recipe):
    recipe = elastic_recipe(
        dataset,
        tmp_path,
        np=512,  # clamped by Data-Juicer's setup to this node's CPUs; the recipe keeps it
        image_key="pictures",
        keep_stats_in_res_ds=True,
        ray_address="auto",
        process=[
            {"whitespace_normalization_mapper": None},
            {"text_length_filter": {"min_len": 3, "text_key": "text"}},
        ],
    )
    return parse(write_recipe(**recipe), "--text_length_filter.max_len", "99")


def test_contents(cfg):
    recipe = build_shard_recipe(cfg)
    assert recipe["executor_type"] == "ray"
    for absent in ("elastic", "dataset_path", "export_path", "work_dir", "job_id", "config", "ray_address"):
        assert absent not in recipe
    assert recipe["np"] == 512 and cfg.np != 512
    assert recipe["image_key"] == "pictures"
    assert recipe["keep_stats_in_res_ds"] is True
    assert recipe["skip_op_error"] is True and recipe["text_keys"] == "text"
    assert [next(iter(op)) for op in recipe["process"]] == ["whitespace_normalization_mapper", "text_length_filter"]
    mapper, length = (next(iter(op.values())) for op in recipe["process"])
    assert length["min_len"] == 3 and length["max_len"] == 99  # YAML arg and CLI override
    assert length["text_key"] == "text"  # set by the user: kept
    for injected in ("work_dir", "num_proc", "text_key", "image_key", "skip_op_error", "turbo"):
        assert injected not in mapper
    assert list(recipe) == sorted(recipe)
    json.dumps(recipe)


def test_deterministic_and_independent_of_cwd(tmp_path, dataset, write_recipe, monkeypatch):
    path = write_recipe(**elastic_recipe(dataset, tmp_path))
    first = build_shard_recipe(parse(path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    second = build_shard_recipe(parse(path))
    assert first == second
    assert recipe_hash(first) == recipe_hash(second)
    assert recipe_hash(dict(reversed(list(first.items())))) == recipe_hash(first)
    assert len(recipe_hash(first)) == 64


def test_relative_custom_operator_paths_become_absolute(tmp_path, dataset, write_recipe, monkeypatch):
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "elastic_recipe_test_upper.py").write_text(CUSTOM_OP.format(name="elastic_recipe_test_upper_mapper"))
    monkeypatch.chdir(tmp_path)
    path = write_recipe(
        **elastic_recipe(
            dataset,
            tmp_path,
            custom_operator_paths=["ops/elastic_recipe_test_upper.py"],
            process=[{"elastic_recipe_test_upper_mapper": None}],
        )
    )
    recipe = build_shard_recipe(parse(path))
    assert recipe["custom_operator_paths"] == [str(ops / "elastic_recipe_test_upper.py")]
    assert [list(op) for op in recipe["process"]] == [["elastic_recipe_test_upper_mapper"]]


def test_shard_recipe_is_a_valid_ray_config(cfg, tmp_path, monkeypatch):
    from data_juicer.utils import resource_utils

    recipe = build_shard_recipe(cfg)
    shard = tmp_path / "shard.yaml"
    paths = {"dataset_path": str(tmp_path / "input.jsonl"), "export_path": str(tmp_path / "a" / "o.jsonl")}
    shard.write_text(yaml.safe_dump({**recipe, **paths}))
    # init_configs for executor_type ray would start Ray for its CPU count check.
    monkeypatch.setattr(resource_utils, "check_and_initialize_ray", lambda cfg=None: False)
    monkeypatch.setenv("RAY_JOB", "0")
    worker_cfg = parse(shard)
    assert worker_cfg.executor_type == "ray"
    for (name, args), op in zip((next(iter(o.items())) for o in recipe["process"]), worker_cfg.process, strict=True):
        worker_args = op[name]
        assert {k: worker_args[k] for k in args} == args
        assert "num_proc" not in args  # Ray semantics: no injected num_proc


def test_adaptive_batching_flag_reaches_the_shard_recipe(tmp_path, dataset, write_recipe):
    cfg = parse(write_recipe(**elastic_recipe(dataset, tmp_path, elastic_juicer_adaptive_batching=True)))
    assert cfg.elastic_juicer_adaptive_batching is False  # the driver runs no operator
    assert build_shard_recipe(cfg)["elastic_juicer_adaptive_batching"] is True


def test_cfg_built_by_hand_falls_back_to_its_own_values(cfg):
    from copy import deepcopy

    recipe = build_shard_recipe(deepcopy(cfg))  # a copy has no kept parse
    assert recipe["executor_type"] == "ray" and "ds_cache_dir" not in recipe
    assert all("work_dir" not in next(iter(op.values())) for op in recipe["process"])


def test_media_keys(cfg):
    assert media_keys(cfg) == {"image_key": "pictures", "audio_key": "audios", "video_key": "videos"}


def test_index_key(tmp_path, dataset, write_recipe):
    ops = [{"whitespace_normalization_mapper": {"index_key": "row_idx"}}, {"text_length_filter": None}]
    assert index_key(parse(write_recipe(**elastic_recipe(dataset, tmp_path, process=ops)))) == "row_idx"
    assert index_key(parse(write_recipe("n.yaml", **elastic_recipe(dataset, tmp_path)))) is None
    ops[1] = {"text_length_filter": {"index_key": "other"}}
    with pytest.raises(RecipeError, match="row_idx"):
        index_key(parse(write_recipe("b.yaml", **elastic_recipe(dataset, tmp_path, process=ops))))


def test_empty_process_is_refused(tmp_path, dataset, write_recipe):
    with pytest.raises(RecipeError) as info:
        build_shard_recipe(parse(write_recipe(**elastic_recipe(dataset, tmp_path, process=[]))))
    assert info.value.where == "process"
