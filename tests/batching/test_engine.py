"""MicroBatcher: lossless slicing, retries, contracts and errors, with synthetic OOM traces."""

from __future__ import annotations

import gc
import weakref

import pyarrow as pa
import pytest

from data_juicer_elastic.batching.engine import PARTITION_COLUMN, MicroBatcher
from data_juicer_elastic.batching.policy import BatchPolicy, PolicyConfig
from data_juicer_elastic.errors import BatchContractError, MicroBatchOOMError


class FakeOOM(RuntimeError):
    def __init__(self, rows: int):
        super().__init__(f"CUDA out of memory. Tried to allocate for {rows} rows")


class Model:
    """Runs out of memory above ``capacity`` rows; doubles ``x``; mutates its input first (careless code)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.calls: list[int] = []

    def __call__(self, piece: dict) -> dict:
        n = len(piece["x"])
        self.calls.append(n)
        for i in range(n):
            piece["x"][i] = piece["x"][i] * 2  # in place, before the failure
        piece["tags"] = [t + ["seen"] for t in piece["tags"]] if "tags" in piece else None
        if n > self.capacity:
            raise FakeOOM(n)
        piece["y"] = [v + 1 for v in piece["x"]]
        if piece["tags"] is None:
            del piece["tags"]
        return piece


def batcher(fn, ceiling: int = 64, **kwargs) -> MicroBatcher:
    kwargs.setdefault("cleanup", lambda: None)
    kwargs.setdefault("sleep", lambda s: None)
    return MicroBatcher(fn, BatchPolicy(ceiling), **kwargs)


def test_dict_batch_recovers_losslessly_and_in_order():
    model = Model(capacity=10)
    run = batcher(model)
    batch = {"id": list(range(64)), "x": list(range(64))}
    out = run(batch)
    assert out["id"] == list(range(64))
    assert out["x"] == [2 * i for i in range(64)]  # doubled exactly once despite failed in-place calls
    assert out["y"] == [2 * i + 1 for i in range(64)]
    assert batch["x"] == list(range(64))  # the caller's batch is untouched
    assert run.stats.ooms > 0 and run.stats.rows_out == 64
    assert run.policy.budget <= 10 < run.policy.failing


def test_arrow_batch_and_nested_values_are_isolated():
    model = Model(capacity=7)
    table = pa.table({"id": list(range(30)), "x": list(range(30)), "tags": [["a"]] * 30})
    out = batcher(model, ceiling=30)(table)
    assert out["id"] == list(range(30))
    assert out["tags"] == [["a", "seen"]] * 30  # nested lists: one append, not one per failed try
    dict_batch = {"id": list(range(30)), "x": list(range(30)), "tags": [["a"] for _ in range(30)]}
    out = batcher(Model(capacity=7), ceiling=30)(dict_batch)
    assert out["tags"] == [["a", "seen"]] * 30
    assert dict_batch["tags"] == [["a"]] * 30


def test_row_costs_limit_the_micro_batch():
    seen = []

    def fn(piece):
        cost = sum(piece["len"])
        seen.append(cost)
        if cost > 100:
            raise FakeOOM(len(piece["len"]))
        return piece

    lengths = [1, 90, 1, 1, 50, 50, 1, 1, 1, 99] * 10
    run = batcher(fn, ceiling=100, row_costs=lambda b: b["len"])
    out = run({"len": lengths})
    assert out["len"] == lengths
    assert run.stats.ooms <= 6


def test_contract_row_count():
    with pytest.raises(BatchContractError, match="returned 1 rows for a 4-row micro-batch"):
        batcher(lambda p: {"x": p["x"][:1]}, ceiling=4)({"x": [1, 2, 3, 4]})


def test_contract_order_columns():
    def reorder(piece):
        return {k: list(reversed(v)) for k, v in piece.items()}

    with pytest.raises(BatchContractError, match="reordered column"):
        batcher(reorder, ceiling=4)({PARTITION_COLUMN: [0, 1, 2, 3], "x": [1, 2, 3, 4]})
    with pytest.raises(BatchContractError, match="reordered column 'idx'"):
        batcher(reorder, ceiling=4, order_columns=("idx",))({"idx": [0, 1, 2, 3]})


def test_contract_schema_across_slices():
    calls = []

    def fn(piece):
        calls.append(1)
        if len(piece["x"]) > 2:
            raise FakeOOM(3)
        return {**piece, f"col{len(calls)}": piece["x"]}

    with pytest.raises(BatchContractError, match="different columns"):
        batcher(fn, ceiling=4)({"x": [1, 2, 3, 4]})


def test_contract_error_is_never_skipped():
    with pytest.raises(BatchContractError):
        batcher(lambda p: {"x": []}, ceiling=4, skip_errors=True)({"x": [1, 2, 3, 4]})


def test_non_oom_error_propagates_without_skip():
    def fn(piece):
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        batcher(fn)({"x": [1, 2, 3]})


def test_non_oom_error_with_skip_drops_only_that_micro_batch():
    def fn(piece):
        if len(piece["x"]) > 4:
            raise FakeOOM(len(piece["x"]))
        if 13 in piece["x"]:
            raise ValueError("row 13 is bad")
        return piece

    run = batcher(fn, ceiling=16, skip_errors=True)
    out = run({"x": list(range(16))})
    assert 13 not in out["x"]
    assert out["x"] == [v for v in range(16) if v not in range(12, 16)]  # the 4-row slice holding 13
    assert run.stats.skipped_rows == 4 and run.stats.rows_out == 12


def test_all_slices_skipped_returns_empty_columns_like_data_juicer():
    def fn(piece):
        raise ValueError("always")

    out = batcher(fn, skip_errors=True)({"x": [1, 2], "text": ["a", "b"]})
    assert out == {"x": [], "text": [], "__dj__stats__": [], "__dj__source_file__": []}


@pytest.mark.parametrize("skip", [False, True])
def test_terminal_oom_raises_after_bounded_waits_even_with_skip(skip):
    waits = []

    def fn(piece):
        raise FakeOOM(len(piece["x"]))

    run = batcher(fn, ceiling=8, skip_errors=skip, sleep=waits.append)
    with pytest.raises(MicroBatchOOMError, match="out of memory with 1 row") as info:
        run({"x": list(range(8))})
    assert waits == [1.0, 2.0, 3.0]
    assert isinstance(info.value.__cause__, FakeOOM)
    assert run.stats.terminal_ooms == 1
    assert run.stats.ooms <= run.policy.slice_oom_budget


def test_floor_wait_then_success_is_lossless():
    state = {"fails": 2}

    def fn(piece):
        if len(piece["x"]) > 1:
            raise FakeOOM(len(piece["x"]))
        if piece["x"][0] == 3 and state["fails"]:
            state["fails"] -= 1
            raise FakeOOM(1)  # a neighbour holds memory for a moment
        return piece

    waits = []
    out = batcher(fn, ceiling=4, sleep=waits.append)({"x": [1, 2, 3, 4]})
    assert out["x"] == [1, 2, 3, 4] and waits == [1.0, 2.0]


def test_frames_are_released_before_cleanup():
    class Tensor:
        pass

    refs: list[weakref.ref] = []
    alive_at_cleanup: list[bool] = []

    def fn(piece):
        activations = Tensor()  # held only by this frame
        refs.append(weakref.ref(activations))
        if len(piece["x"]) > 2:
            raise FakeOOM(len(piece["x"]))
        return piece

    def cleanup():
        alive_at_cleanup.append(refs[-1]() is not None)

    gc.disable()  # prove it is freed by reference counting, not by a collection
    try:
        batcher(fn, ceiling=4, cleanup=cleanup)({"x": [1, 2, 3, 4]})
    finally:
        gc.enable()
    assert alive_at_cleanup and not any(alive_at_cleanup)


def test_empty_batch_passes_through():
    assert batcher(lambda p: p)({"x": []}) == {"x": []}


def test_policy_state_persists_across_outer_batches():
    model = Model(capacity=10)
    run = MicroBatcher(model, BatchPolicy(64, PolicyConfig()), cleanup=lambda: None, sleep=lambda s: None)
    run({"x": list(range(64))})
    first = run.stats.ooms
    run({"x": list(range(64))})
    assert run.stats.ooms - first <= 1  # the second outer batch starts from what the first learned


def padded_model(capacity: float, seen: list | None = None, bad: int | None = None):
    """Memory = rows x the longest `len` of the call (padding); raises on row `bad` (a non-OOM error)."""

    def fn(piece):
        lens = piece["len"]
        if seen is not None:
            seen.append(list(piece["id"]))
        if len(lens) * max(lens) > capacity:
            raise FakeOOM(len(lens))
        if bad is not None and bad in piece["id"]:
            raise ValueError("bad row")
        piece["out"] = [i * 10 for i in piece["id"]]
        return piece

    return fn


LENS = [5, 80, 6, 7, 90, 5, 6, 70, 8, 5, 6, 7] * 4


def test_sort_by_cost_slices_in_cost_order_and_restores_input_order():
    seen: list = []
    run = batcher(padded_model(200.0, seen), ceiling=48, row_costs=lambda b: b["len"], sort_by_cost=True)
    batch = {"id": list(range(48)), "len": list(LENS)}
    for _ in range(3):
        seen.clear()
        out = run(batch)
        assert out["id"] == list(range(48)) and out["out"] == [i * 10 for i in range(48)]
        assert out["len"] == LENS and batch["len"] == LENS
    assert run.stats.sorted_batches == 3
    # the last (learned) pass: every call held rows of one length class, longest first
    calls = [[LENS[i] for i in ids] for ids in seen]
    assert [max(c) for c in calls] == sorted((max(c) for c in calls), reverse=True)
    assert sum(max(c) >= 70 and min(c) <= 8 for c in calls) <= 1  # short rows meet long ones at one boundary


def test_sort_by_cost_arrow_and_skip_keep_input_order():
    table = pa.table({"id": list(range(48)), "len": list(LENS)})
    out = batcher(padded_model(200.0), ceiling=48, row_costs=lambda b: b.column("len").to_pylist(), sort_by_cost=True)(
        table
    )
    assert out["id"] == list(range(48))
    run = batcher(padded_model(200.0, bad=7), ceiling=48, row_costs=lambda b: b["len"], sort_by_cost=True)
    with pytest.raises(ValueError, match="bad row"):
        run({"id": list(range(48)), "len": list(LENS)})
    run = batcher(
        padded_model(200.0, bad=7), ceiling=48, row_costs=lambda b: b["len"], sort_by_cost=True, skip_errors=True
    )
    out = run({"id": list(range(48)), "len": list(LENS)})
    dropped = sorted(set(range(48)) - set(out["id"]))
    assert 7 in dropped and out["id"] == [i for i in range(48) if i not in dropped]
    assert out["out"] == [i * 10 for i in out["id"]]
    assert all(LENS[i] == LENS[7] or LENS[i] <= 8 for i in dropped)  # one slice of short rows, not a stretch


def test_no_sort_when_the_batch_fits_or_without_costs():
    run = batcher(padded_model(10_000.0), ceiling=48, row_costs=lambda b: b["len"], sort_by_cost=True)
    run.policy.seed(safe=5_000.0, failing=None)  # a learned budget the whole batch fits
    run({"id": list(range(48)), "len": list(LENS)})
    assert run.stats.sorted_batches == 0 and run.stats.slices == 1  # one slice: order cannot matter
    run = batcher(Model(capacity=10), sort_by_cost=True)  # no row costs: nothing to sort by
    assert run({"id": list(range(30)), "x": list(range(30))})["id"] == list(range(30))
    assert run.stats.sorted_batches == 0
