"""quarantine.collector: exactly the failing rows are found, every other row's output is kept in
order, and the calls are O(k log B) (counted)."""

from __future__ import annotations

import math

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.quarantine.collector import isolate


class Picky:
    """A batched operator that raises on any batch holding a bad row, and mutates its input first."""

    def __init__(self, bad: set[int]):
        self.bad, self.calls = bad, 0

    def __call__(self, batch: dict) -> dict:
        self.calls += 1
        batch["text"] = [t.upper() for t in batch["text"]]  # in place, before failing: must not leak
        bad = [i for i in batch["idx"] if i in self.bad]
        if bad:
            raise ValueError(f"bad row {bad[0]}")
        return {"idx": batch["idx"], "text": batch["text"]}


def run(rows: int, bad: set[int], *, arrow: bool):
    data = {"idx": list(range(rows)), "text": [f"row {i}" for i in range(rows)]}
    batch = pa.table(data) if arrow else data
    op = Picky(bad)
    try:
        op(pa.table(data).to_pydict() if arrow else {k: list(v) for k, v in data.items()})
        raise AssertionError("the whole batch should fail")
    except ValueError as exc:
        first = exc
    op.calls = 0
    found = isolate(op, batch, 0, rows, rows, first)
    return found, op.calls


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(min_value=1, max_value=700),
    data=st.data(),
    arrow=st.booleans(),
)
def test_exactly_the_failing_rows_and_every_other_row_in_order(rows, data, arrow):
    bad = set(data.draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=min(rows, 12))))
    found, calls = run(rows, bad, arrow=arrow)
    assert sorted(f.position for f in found.failures) == sorted(bad)
    assert all(f.error_type == "ValueError" and f.message == f"bad row {f.position}" for f in found.failures)
    kept = [i for _, out in found.parts for i in out["idx"]]
    assert kept == [i for i in range(rows) if i not in bad]
    texts = [t for _, out in found.parts for t in out["text"]]
    assert texts == [f"ROW {i}" for i in kept]  # each part ran once on its own fresh input
    # a failing range has two children; at most k ranges fail per level of ceil(log2 B) levels
    assert found.calls == calls <= 2 * len(bad) * max(1, math.ceil(math.log2(rows)))


def test_three_bad_rows_of_512_cost_at_most_54_calls():
    found, calls = run(512, {7, 300, 301}, arrow=True)
    assert [f.position for f in found.failures] == [7, 300, 301]
    assert sum(len(r) for r, _ in found.parts) == 509
    assert calls <= 2 * 3 * 9
    print(f"3 failing rows of 512: {calls} extra calls")


def test_one_row_batch_is_the_failure_itself():
    found = isolate(lambda b: b, {"idx": [5]}, 0, 1, 1, KeyError("x"))
    assert [(f.position, f.error_type) for f in found.failures] == [(0, "KeyError")] and found.calls == 0


def test_an_error_of_the_batch_not_of_a_row_keeps_every_row():
    def fails_when_big(batch):
        if len(batch["idx"]) > 4:
            raise RuntimeError("too big")
        return batch

    found = isolate(fails_when_big, {"idx": list(range(16))}, 0, 16, 16, RuntimeError("too big"))
    assert found.failures == [] and [position for rows, _ in found.parts for position in rows] == list(range(16))


def test_a_fatal_error_is_raised_not_quarantined():
    import pytest

    def oom(batch):
        raise MemoryError("out of memory")

    with pytest.raises(MemoryError):
        isolate(oom, {"idx": list(range(8))}, 0, 8, 8, MemoryError(), fatal=lambda e: isinstance(e, MemoryError))
