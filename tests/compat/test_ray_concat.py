"""compat.ray_concat: Ray 2.60 cannot concatenate blocks that typed one column differently."""

from __future__ import annotations

import pyarrow as pa
import pytest

from data_juicer_elastic.compat import ray_concat


def struct_blocks() -> list[pa.Table]:
    # What Ray makes of an operator's output: batch 1 never has meta.extra, batch 2 does.
    first = pa.table({"meta": pa.array([{"n": 1, "extra": None}])})
    second = pa.table({"meta": pa.array([{"n": 2, "extra": {"x": "y"}}])})
    assert pa.types.is_null(first.schema.field("meta").type.field("extra").type)
    return [first, second]


def mixed_blocks() -> list[pa.Table]:
    # A column mixing JSON types, re-typed per batch: only ints here, only bools there, objects elsewhere.
    from ray.data.extensions import ArrowPythonObjectArray

    return [
        pa.table({"mix": pa.array([1, 2]), "n": [0, 1]}),
        pa.table({"mix": pa.array([True]), "n": [2]}),
        pa.table({"mix": ArrowPythonObjectArray.from_objects(["x", {"o": 1}]), "n": [3, 4]}),
        pa.table({"mix": pa.array([{"o": 2}]), "n": [5]}),
    ]


def test_the_targets_are_where_this_ray_has_them():
    assert "found" in ray_concat.self_check()


def test_ray_alone_fails_and_the_fixes_concatenate(monkeypatch):
    from ray.data._internal.arrow_ops import transform_pyarrow as tp

    for name in ray_concat.TARGETS:
        function = getattr(tp, name)
        monkeypatch.setattr(tp, name, getattr(function, "__wrapped__", function))  # Ray's own
    with pytest.raises(TypeError, match="not iterable"):  # the bugs this module exists for
        tp.concat(struct_blocks(), promote_types=True)
    with pytest.raises(Exception, match="incompatible types"):
        tp.concat(mixed_blocks()[:2], promote_types=True)
    ints_bools_struct = [mixed_blocks()[i] for i in (0, 1, 3)]
    assert pa.types.is_struct(tp.unify_schemas([b.schema for b in ints_bools_struct]).field("mix").type)
    with pytest.raises(Exception, match="incompatible types"):  # Ray "unified" it to the struct
        tp.concat(ints_bools_struct, promote_types=True)

    ray_concat.install()
    ray_concat.install()  # idempotent
    merged = tp.concat(struct_blocks(), promote_types=True)
    assert merged.to_pylist() == [{"meta": {"n": 1, "extra": None}}, {"meta": {"n": 2, "extra": {"x": "y"}}}]
    mixed = tp.concat(mixed_blocks(), promote_types=True)
    assert mixed.column("mix").to_pylist() == [1, 2, True, "x", {"o": 1}, {"o": 2}]
    assert tp.concat(ints_bools_struct).column("mix").to_pylist() == [1, 2, True, {"o": 2}]
    assert mixed.column("n").to_pylist() == list(range(6)), "other columns and the row order are untouched"


def test_a_moved_target_is_one_integration_error(monkeypatch):
    from ray.data._internal.arrow_ops import transform_pyarrow

    from data_juicer_elastic.errors import IntegrationError

    monkeypatch.delattr(transform_pyarrow, "_backfill_missing_fields")
    with pytest.raises(IntegrationError, match="_backfill_missing_fields"):
        ray_concat.self_check()


def test_self_check():
    assert ray_concat.MODULE in ray_concat.self_check()
