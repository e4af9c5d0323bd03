"""check_shard_safe: only per-sample Mapper/Filter operators, no shared statistics files."""

from __future__ import annotations

import pytest

from data_juicer_elastic.errors import RecipeError
from data_juicer_elastic.integration.recipe import check_shard_safe

SAFE = {"whitespace_normalization_mapper": {}}


def recipe(*ops, **settings) -> dict:
    return {"executor_type": "ray", "process": [SAFE, *ops], **settings}


def test_mappers_and_filters_pass():
    assert check_shard_safe(recipe({"text_length_filter": {"min_len": 3}})) == []


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("topk_specified_field_selector", "Selector"),
        ("naive_grouper", "Grouper"),
        ("entity_attribute_aggregator", "Aggregator"),
        ("ray_repartition_pipeline", "Pipeline"),
    ],
)
def test_refused_operator_classes(op, kind):
    with pytest.raises(RecipeError) as info:
        check_shard_safe(recipe({op: None}))
    assert info.value.where == f"process[1] {op}"
    assert kind in info.value.message
    assert "separate Data-Juicer job" in info.value.hint


def test_unknown_operator():
    with pytest.raises(RecipeError) as info:
        check_shard_safe(recipe({"no_such_mapper": {}}))
    assert info.value.where == "process[1] no_such_mapper"
    assert "custom_operator_paths" in info.value.hint


def test_operator_stats_export_path_is_refused():
    with pytest.raises(RecipeError) as info:
        check_shard_safe(recipe({"text_length_filter": {"stats_export_path": "/shared/stats.jsonl"}}))
    assert info.value.where == "process[1] text_length_filter.stats_export_path"


@pytest.mark.parametrize(
    ("settings", "where"),
    [
        ({"stats_export_path": "/shared/stats.jsonl"}, "stats_export_path"),
        ({"encrypt_before_export": True}, "encrypt_before_export"),
        ({"decrypt_after_reading": True}, "decrypt_after_reading"),
        ({"elastic_juicer_profile_seed": True}, "elastic_juicer_profile_seed"),
        ({"elastic_juicer_adaptive_batching": True, "op_fusion": True}, "op_fusion"),
    ],
)
def test_refused_settings(settings, where):
    with pytest.raises(RecipeError) as info:
        check_shard_safe(recipe(**settings))
    assert info.value.where == where


@pytest.mark.parametrize(
    ("export", "export_type", "shard_size", "where"),
    [
        ("out/merged.json", None, 0, "export_path"),  # the default executor writes a JSON array there
        ("out/merged.parquet", None, 0, "export_path"),
        ("out/merged", None, 0, "export_path"),
        ("out/merged.jsonl", "parquet", 0, "export_type"),
        ("out/merged.jsonl", None, 1024, "export_shard_size"),
    ],
)
def test_export_settings_that_cannot_be_honoured_are_refused(export, export_type, shard_size, where):
    from data_juicer_elastic.integration.recipe import check_export

    with pytest.raises(RecipeError) as info:
        check_export(export, export_type, shard_size)
    assert info.value.where == where
    check_export("out/merged.jsonl", None, 0)
    check_export("out/merged.json", "jsonl", 0)  # an explicit type wins, as in Data-Juicer


def test_missing_process_list():
    with pytest.raises(RecipeError) as info:
        check_shard_safe({"executor_type": "ray"})
    assert info.value.where == "process"


def test_fixed_save_dir_warns():
    warnings = check_shard_safe(recipe({"image_face_blur_mapper": {"save_dir": "/shared/blurred"}}))
    assert len(warnings) == 1 and "process[1] image_face_blur_mapper" in warnings[0]


CUSTOM = """
from data_juicer.ops.base_op import OPERATORS, Deduplicator, Mapper


@OPERATORS.register_module("elastic_check_test_mapper")
class CheckTestMapper(Mapper):
    def process_single(self, sample):
        return sample


@OPERATORS.register_module("elastic_check_test_deduplicator")
class CheckTestDeduplicator(Deduplicator):
    def compute_hash(self, sample):
        return sample

    def process(self, dataset, show_num=0):
        return dataset, {}
"""


def test_custom_operators_are_resolved(tmp_path):
    path = tmp_path / "elastic_check_test_ops.py"
    path.write_text(CUSTOM)
    ok = recipe({"elastic_check_test_mapper": None}, custom_operator_paths=[str(path)])
    assert check_shard_safe(ok) == []
    assert check_shard_safe(ok) == []  # already loaded: not loaded twice
    bad = recipe({"elastic_check_test_deduplicator": None}, custom_operator_paths=[str(path)])
    with pytest.raises(RecipeError, match="deduplicator is not supported by elastic_sharded"):
        check_shard_safe(bad)


def test_bad_custom_operator_path():
    with pytest.raises(RecipeError) as info:
        check_shard_safe(recipe(custom_operator_paths=["/no/such/ops.py"]))
    assert info.value.where == "/no/such/ops.py"
