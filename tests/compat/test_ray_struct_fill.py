"""compat.ray_struct_fill: Ray 2.60 cannot concatenate blocks whose struct field is null-typed in one."""

from __future__ import annotations

import pyarrow as pa
import pytest

from data_juicer_elastic.compat import ray_struct_fill


def blocks() -> list[pa.Table]:
    # What Ray makes of an operator's output: batch 1 never has meta.extra, batch 2 does.
    first = pa.table({"meta": pa.array([{"n": 1, "extra": None}])})
    second = pa.table({"meta": pa.array([{"n": 2, "extra": {"x": "y"}}])})
    assert pa.types.is_null(first.schema.field("meta").type.field("extra").type)
    return [first, second]


def test_the_target_is_where_this_ray_has_it():
    assert "found" in ray_struct_fill.self_check()


def test_ray_alone_fails_and_the_fix_concatenates(monkeypatch):
    from ray.data._internal.arrow_ops import transform_pyarrow

    original = getattr(transform_pyarrow._backfill_missing_fields, "__wrapped__", None)
    original = original or transform_pyarrow._backfill_missing_fields
    monkeypatch.setattr(transform_pyarrow, "_backfill_missing_fields", original)
    with pytest.raises(TypeError, match="not iterable"):  # the bug this module exists for
        transform_pyarrow.concat(blocks(), promote_types=True)

    ray_struct_fill.install()
    ray_struct_fill.install()  # idempotent
    merged = transform_pyarrow.concat(blocks(), promote_types=True)
    assert merged.to_pylist() == [{"meta": {"n": 1, "extra": None}}, {"meta": {"n": 2, "extra": {"x": "y"}}}]


def test_a_moved_target_is_one_integration_error(monkeypatch):
    from ray.data._internal.arrow_ops import transform_pyarrow

    from data_juicer_elastic.errors import IntegrationError

    monkeypatch.delattr(transform_pyarrow, "_backfill_missing_fields")
    with pytest.raises(IntegrationError, match="_backfill_missing_fields"):
        ray_struct_fill.self_check()
