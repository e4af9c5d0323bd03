"""Lossless rows without Ray: prepare's row schema -> Arrow as operators see it -> Ray's re-typing
of what operators return -> the writer's restore, property-tested against the input itself."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.execution.row_writer import encode_row, equivalent, restore_fields
from data_juicer_elastic.execution.shard_reader import ROW_COLUMN, ArrowRows
from data_juicer_elastic.rows.row_schema import RowSchema

from ..values import strict_equal

KEYS = ["text", "score", "meta", "tags", "id", "x"]
TRICKY_STRINGS = ["2023-04-27T00:00:00", "00123", "1e5", "true", "null", "", "漢字 é", "a/b\\c", "\u2028"]
TRICKY_FLOATS = [1e-12, 3.5e-11, 0.43276706790505337, 1e300, -0.0, 0.0, 5e-324, 1.7976931348623157e308, 2.5]
TRICKY_INTS = [0, 193, -1, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, 2**70 + 3, 10**400]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(TRICKY_INTS),
    st.integers(-(2**64), 2**64),
    st.sampled_from(TRICKY_FLOATS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(TRICKY_STRINGS),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), inner, max_size=3),
    ),
    max_leaves=12,
)
rows = st.lists(st.dictionaries(st.sampled_from(KEYS), values, max_size=5), min_size=1, max_size=12)


def ray_retyped(table: pa.Table) -> pa.Table:
    """What Ray makes of an operator's output batch: every column re-inferred from Python values
    (Ray's convert_to_pyarrow_array), pickled objects where Arrow has no type."""
    from ray.data.extensions import ArrowPythonObjectArray

    columns = {}
    for name in table.column_names:
        data = table.column(name).to_pylist()
        try:
            columns[name] = pa.array(data)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            columns[name] = ArrowPythonObjectArray.from_objects(data)
    return pa.table(columns)


def through_arrow(batch: list[dict], schema: RowSchema, retype: bool) -> list[dict]:
    rows_in = ArrowRows.from_manifest(schema.to_json(), where="test")
    table = rows_in.table(batch, 0)
    if retype:
        table = ray_retyped(table)
    out = table.to_pylist()
    return [restore_fields(batch[row.pop(ROW_COLUMN)], row) for row in out]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows, st.booleans())
def test_untouched_rows_come_back_exactly(batch, retype):
    schema = RowSchema()
    schema.observe_all(batch)
    back = through_arrow(batch, schema, retype)
    for original, restored in zip(batch, back, strict=True):
        assert strict_equal(original, restored), (original, restored)
        # and as written: the encoded line parses back to the input (JSON types, digits, keys)
        assert strict_equal(json.loads(encode_row(restored)), original)


@settings(max_examples=200, deadline=None)
@given(rows, st.data())
def test_what_an_operator_changed_is_kept_and_the_rest_restored(batch, data):
    schema = RowSchema()
    schema.observe_all(batch)
    rows_in = ArrowRows.from_manifest(schema.to_json(), where="test")
    out = rows_in.table(batch, 0).to_pylist()
    i = data.draw(st.integers(0, len(out) - 1))
    out[i]["text"] = "CHANGED by an operator"
    out[i]["added"] = 1
    out[i]["__added__"] = None  # an operator's null in a key the row lacked: Arrow's filling, to the writer
    for j, row in enumerate(out):
        restored = restore_fields(batch[row.pop(ROW_COLUMN)], row)
        if j == i:
            assert restored["text"] == "CHANGED by an operator" and "__added__" not in restored
            added = [k for k in restored if k not in batch[j]]
            assert list(restored)[len(batch[j]) :] == added == sorted(added), "new keys follow the input's, by name"
            others = {k: v for k, v in batch[j].items() if k != "text"}
            assert strict_equal({k: restored[k] for k in others}, others)
        else:
            assert strict_equal(restored, batch[j])


def test_known_arrow_losses_are_put_back():
    batch = [
        {"score": 193, "meta": {"src": "a"}, "date": "2023-04-27T00:00:00", "big": 2**53 + 1},
        {"score": 2.5, "meta": {"src": "b", "extra": {"x": [1, 2]}}, "big": 1.5, "late": None},
        {"meta": {"src": "c"}, "neg": -0.0, "tiny": 1e-12, "huge": 2**70 + 1},
    ]
    schema = RowSchema()
    schema.observe_all(batch)
    table = ArrowRows.from_manifest(schema.to_json(), where="test").table(batch, 0)
    seen = table.to_pylist()
    assert seen[0]["score"] == 193.0 and type(seen[0]["score"]) is float, "operators see a double column"
    assert seen[0]["meta"]["extra"] is None and seen[0]["date"] == "2023-04-27T00:00:00"
    assert seen[2]["huge"] == float(2**70 + 1), "beyond int64: a double, as the default executor reads it"
    for original, restored in zip(batch, through_arrow(batch, schema, True), strict=True):
        assert strict_equal(original, restored)


@pytest.mark.parametrize(
    "out, value, same",
    [
        (193.0, 193, True),
        (9007199254740992.0, 2**53 + 1, True),  # the double Arrow made of it
        (1.0, True, True),  # pyarrow turns a bool after a double into 1.0 ([1.5, True])
        (1, True, False),
        (True, 1, False),
        (0.0, -0.0, False),
        ({"a": 1, "b": None}, {"a": 1}, True),
        ({"a": 1, "b": 2}, {"a": 1}, False),
        ({"a": 1}, {"a": 1, "b": None}, False),
        ([1.0, 2.0], [1, 2], True),
        (None, 0, False),
        (float(2**1000), 10**400, False),
    ],
)
def test_equivalence_table(out, value, same):
    assert equivalent(out, value) is same


def test_encoding_is_deterministic_and_total():
    assert encode_row({"a": 1e16, "b": "é/\u2028", "c": [1, None]}) == encode_row(
        {"a": 1e16, "b": "é/\u2028", "c": [1, None]}
    )
    big = encode_row({"n": 2**70, "f": 0.1, "nan": float("nan")})  # beyond 64 bits: Python's json
    assert json.loads(big) == {"n": 2**70, "f": 0.1, "nan": None}
    assert encode_row({"nan": float("nan"), "inf": float("inf")}) == b'{"nan":null,"inf":null}\n'
    with pytest.raises(Exception, match="cannot be written as JSON"):
        encode_row({"b": b"bytes"})


# -- operators that add, delete and re-type nested keys: the bytes of a row do not depend on its batch --

PATHS = [("meta", "src"), ("meta", "n"), ("meta", "deep", "x"), ("meta",), ("tag",), ("extra", "a")]
NEW_VALUES = [None, "s", 7, {}, {"k": "v"}, {"z": 1, "a": None}, [1, 2], ["x"], {"deep": {"y": "w"}}]
edit = st.tuples(
    st.sampled_from(PATHS),
    st.sampled_from(["delete", "set"]),
    st.sampled_from(NEW_VALUES),
    st.integers(1, 3),  # the rows it applies to: index % every == offset
    st.integers(0, 2),
)
nested_rows = st.lists(
    st.fixed_dictionaries(
        {"text": st.sampled_from(["a", "b c"])},
        optional={
            "meta": st.fixed_dictionaries(
                {}, optional={"src": st.text(max_size=3), "n": st.sampled_from(["1", "x"]), "deep": st.just({"x": "d"})}
            ),
            "tag": st.sampled_from(["t", ""]),
        },
    ),
    min_size=1,
    max_size=8,
)


def _apply(edits, row: dict, index: int) -> dict:
    """The operator: each edit on the rows it picks (a deep copy; parents made where missing)."""
    row = json.loads(json.dumps(row))
    for path, kind, value, every, offset in edits:
        if index % every != offset % every:
            continue
        parent = row
        for key in path[:-1]:
            if not isinstance(parent.get(key), dict):
                if kind == "delete":
                    break
                parent[key] = {}
            parent = parent[key]
        else:
            if kind == "delete":
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = json.loads(json.dumps(value))
    return row


def _retyped(rows: list[dict]) -> list[dict]:
    """What Ray makes of an operator's output batch: one column per key any row has (null in the
    rows without it), each re-inferred from its values (``ray_retyped``)."""
    from ray.data.extensions import ArrowPythonObjectArray

    keys = list(dict.fromkeys(k for row in rows for k in row))
    table = pa.Table.from_pydict({k: ArrowPythonObjectArray.from_objects([row.get(k) for row in rows]) for k in keys})
    return ray_retyped(table).to_pylist()


def _written(batch: list[dict], edits, cuts: list[int]) -> list[bytes]:
    """Each row's output line when the shard is cut at ``cuts`` (each piece one batch)."""
    schema = RowSchema()
    schema.observe_all(batch)
    arrow = ArrowRows.from_manifest(schema.to_json(), where="test")
    lines = []
    for start, end in zip([0, *cuts], [*cuts, len(batch)], strict=True):
        seen = arrow.table(batch[start:end], start).to_pylist()  # what the operator is handed
        for row in _retyped([_apply(edits, row, row[ROW_COLUMN]) for row in seen]):
            number = row.pop(ROW_COLUMN)
            lines.append(encode_row(restore_fields(batch[number], row)))
    return lines


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nested_rows, st.lists(edit, min_size=1, max_size=4), st.data())
def test_an_operators_added_deleted_and_retyped_keys_give_the_same_bytes_in_any_batch(batch, edits, data):
    whole = _written(batch, edits, [])
    assert _written(batch, edits, list(range(1, len(batch)))) == whole, "one row per batch"
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(batch) - 1)), max_size=3)) - {len(batch)})
    assert _written(batch, edits, cuts) == whole, f"cut at {cuts}"
    for row, line in zip(batch, whole, strict=True):
        out = json.loads(line)
        assert list(out)[: len(row)] == list(row), "every input key stays, in the input's order"
        for key, value in row.items():
            touched = any(path[0] == key for path, *_ in edits)
            assert touched or strict_equal(out[key], value), (key, out, row)


def test_a_nested_key_deleted_in_every_other_row_is_null_whatever_the_batch():
    batch = [{"id": i, "meta": {"src": f"s{i}", "n": "x"}} for i in range(4)]
    edits = [(("meta", "src"), "delete", None, 2, 1), (("tag",), "set", "t", 2, 0), (("extra",), "set", None, 1, 0)]
    for cuts in ([], [1, 2, 3]):
        rows = [json.loads(line) for line in _written(batch, edits, cuts)]
        assert rows[1] == {"id": 1, "meta": {"src": None, "n": "x"}}, "deleted: null, as in a batch with the others"
        assert rows[0] == {"id": 0, "meta": {"src": "s0", "n": "x"}, "tag": "t"}
        assert "tag" not in rows[1], "added to some rows: absent in the others"
