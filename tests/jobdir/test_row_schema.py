"""rows.row_schema: the join of every row's JSON types, independent of how prepare cut its blocks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.rows.row_schema import MAX_TYPED_DEPTH, RowSchema, operator_view_notes

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abcd"), inner, max_size=3)),
    max_leaves=8,
)
rows = st.lists(st.dictionaries(st.sampled_from(["k1", "k2", "k3", "k4"]), values, max_size=4), min_size=1, max_size=20)


def schema(*batches: list[dict]) -> RowSchema:
    result = RowSchema()
    for batch in batches:
        result.observe_all(batch)
    return result


@settings(max_examples=300, deadline=None)
@given(rows, st.data())
def test_joining_block_schemas_in_order_equals_observing_every_row(all_rows, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(all_rows)), max_size=4)))
    blocks = [all_rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(all_rows)], strict=True)]
    merged = RowSchema()
    for block in blocks:
        merged.merge(schema(block))  # what prepare's helper processes send, joined in input order
    assert merged.to_json() == schema(all_rows).to_json()
    assert RowSchema.from_json(merged.to_json()) == merged
    assert schema(all_rows, all_rows).to_json() == schema(all_rows).to_json(), "observing again changes nothing"


@pytest.mark.parametrize(
    "batch, expected",
    [
        ([{"a": 1}, {"a": 2}], [["a", "int"]]),
        ([{"a": 1}, {"a": 2.5}], [["a", "float"]]),
        ([{"a": 2**63}], [["a", "float"]]),  # beyond int64: a double column, as Arrow's JSON reader makes it
        ([{"a": 10**400}], [["a", "json"]]),  # beyond any double
        ([{"a": None}, {"a": "x"}], [["a", "string"]]),
        ([{"a": "2023-04-27T00:00:00"}], [["a", "string"]]),
        ([{"a": True}, {"a": 1}], [["a", "json"]]),
        ([{"a": "1"}, {"a": 1}], [["a", "json"]]),
        ([{"a": []}, {"a": [1]}], [["a", {"list": "int"}]]),
        ([{"a": [1, 2.5]}], [["a", {"list": "float"}]]),
        ([{"a": [1, "x"]}], [["a", {"list": "json"}]]),
        ([{"a": {"x": 1}}, {"a": [1]}], [["a", "json"]]),
        ([{"b": 1}, {"a": {"x": 1}, "b": 2}], [["b", "int"], ["a", {"struct": [["x", "int"]]}]]),
        ([{"a": {"x": 1}}, {"a": {"y": "s"}}], [["a", {"struct": [["x", "int"], ["y", "string"]], "partial": True}]]),
        ([{"a": {}}], [["a", {"struct": []}]]),
    ],
)
def test_the_lattice(batch, expected):
    assert schema(batch).to_json() == expected


def test_values_nested_deeper_than_the_bound_make_their_column_json():
    deep = 1
    for _ in range(MAX_TYPED_DEPTH + 10):
        deep = [deep]
    shallow = 1
    for _ in range(MAX_TYPED_DEPTH - 2):
        shallow = {"x": shallow}
    result = schema([{"deep": deep, "shallow": shallow}]).to_json()
    assert "json" in str(result[0][1]) and "json" not in str(result[1][1])


@pytest.mark.parametrize(
    "data", [[["a"]], [["a", "int", 1]], [["a", "int"], ["a", "int"]], [["a", {"struct": [], "partial": False}]], "x"]
)
def test_a_malformed_schema_is_refused(data):
    with pytest.raises(ValueError):
        RowSchema.from_json(data)


def test_operator_view_notes_name_the_columns():
    notes = operator_view_notes(schema([{"meta": {"a": 1}, "mix": 1}, {"meta": {"b": 1}, "mix": "one"}]))
    assert len(notes) == 2 and "meta" in notes[0] and "mix" in notes[1]
    assert operator_view_notes(schema([{"text": "a", "meta": {"a": 1}}])) == []
