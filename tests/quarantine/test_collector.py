"""quarantine.collector on real Data-Juicer operators built through Data-Juicer's own error hooks, in an
attempt context as the shard runner writes it (no Ray: the operators are called as Ray calls them)."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest

pytest.importorskip("data_juicer")

from data_juicer.ops.base_op import Filter, Mapper  # noqa: E402

from data_juicer_elastic.batching import AdaptiveBatchingMixin  # noqa: E402
from data_juicer_elastic.batching.runtime import BatchingContext, StageRef, write_context  # noqa: E402
from data_juicer_elastic.execution.shard_reader import ROW_COLUMN  # noqa: E402
from data_juicer_elastic.jobdir.exports import WORKER_DIR
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.quarantine.collector import (  # noqa: E402
    QuarantinedBatch,
    QuarantinedRow,
    RowFailure,  # noqa: E402
    active_sink,
)

SHARD, ATTEMPT = "part-00000-of-00001", "a1"


class FailIds(Mapper):
    """Batched: raises on any batch holding a bad id; counts its calls."""

    _batched_op = True

    def __init__(self, bad=(), *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bad, self.calls = set(bad), 0

    def process_batched(self, samples):
        self.calls += 1
        samples["text"] = [t + "!" for t in samples["text"]]  # in place before failing: must not leak
        if self.bad & set(samples["id"]):
            raise ValueError(f"bad id {min(self.bad & set(samples['id']))}")
        return samples


class FailSingle(Mapper):
    def __init__(self, bad=(), *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bad = set(bad)

    def process_single(self, sample):
        if sample["id"] in self.bad:
            raise KeyError(sample["id"])
        sample["text"] = sample["text"].upper()
        return sample


class StatsFilter(Filter):
    """Batched stats (Data-Juicer's default compute_stats_batched over process_single), keep even ids."""

    _batched_op = True

    def __init__(self, bad=(), *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bad = set(bad)

    def compute_stats_single(self, sample):
        if sample["id"] in self.bad:
            raise ZeroDivisionError("no stats")
        sample["__dj__stats__"]["parity"] = sample["id"] % 2
        return sample

    def process_single(self, sample):
        if sample["__dj__stats__"]["parity"] == 3:
            raise RuntimeError("unreachable")
        return sample["__dj__stats__"]["parity"] == 0


class AdaptiveFailIds(AdaptiveBatchingMixin, FailIds):
    pass


def batch(rows: int, *, stats: bool = False) -> pa.Table:
    data = {"id": list(range(rows)), "text": [f"t{i}" for i in range(rows)], ROW_COLUMN: list(range(rows))}
    if stats:
        data["__dj__stats__"] = [{} for _ in range(rows)]
    return pa.table(data)


@pytest.fixture
def attempt(tmp_path):
    """An attempt directory inside a job layout, and the work_dir holding its context."""
    layout = JobLayout(tmp_path / "job")
    work = layout.attempt_dir(SHARD, ATTEMPT) / "work"
    write_context(work, BatchingContext(str(layout.root), SHARD, ATTEMPT, [StageRef("stage-0003-occ0-ab:x", "fp")]))
    return layout.attempt_dir(SHARD, ATTEMPT), str(work)


def records(attempt_dir) -> list[dict]:
    return [json.loads(line) for f in sorted((attempt_dir / WORKER_DIR).glob("*.jsonl")) for line in open(f)]


def test_the_hooks_give_quarantine_wrappers_only_with_skip_op_error(attempt):
    assert isinstance(FailIds(skip_op_error=True).process, QuarantinedBatch)
    assert isinstance(FailSingle(skip_op_error=True).process, QuarantinedRow)
    strict = FailIds(bad={1}, skip_op_error=False, work_dir=attempt[1])
    assert not isinstance(strict.process, QuarantinedBatch)
    with pytest.raises(ValueError, match="bad id 1"):  # skip_op_error: false fails on the first error
        strict.process(batch(4))


def test_outside_an_attempt_data_juicer_drops_the_whole_batch():
    op = FailIds(bad={3}, skip_op_error=True, batch_size=8)
    out = op.process(batch(8))
    assert out["id"] == [] and op.calls == 1


def test_a_batch_of_512_with_3_failing_rows_keeps_509_in_order(attempt):
    attempt_dir, work = attempt
    bad = {5, 200, 201}
    op = FailIds(bad=bad, skip_op_error=True, work_dir=work, batch_size=512)
    out = op.process(batch(512))
    assert out["id"] == [i for i in range(512) if i not in bad]
    assert out["text"] == [f"t{i}!" for i in out["id"]]  # each row processed once, from an untouched input
    found = records(attempt_dir)
    assert sorted(r["n"] for r in found) == sorted(bad)
    assert {(r["type"], r["op_index"], r["stage"]) for r in found} == {("ValueError", None, found[0]["stage"])}
    extra_calls = op.calls - 1
    assert extra_calls <= 2 * len(bad) * math.ceil(math.log2(512))


def test_a_row_number_column_of_another_length_names_no_input_row(attempt):
    attempt_dir, work = attempt
    op = FailIds(skip_op_error=True, work_dir=work)
    rows = {"id": [0, 1], "text": ["a", "b"], ROW_COLUMN: [7]}  # one row number for two rows
    active_sink(op).record(op, [RowFailure(1, "ValueError", "bad")], rows, 2)
    (found,) = records(attempt_dir)
    assert found["n"] is None and found["seen"] == {"id": 1, "text": "b"}, found


def test_a_single_row_mapper_sets_the_row_aside(attempt):
    attempt_dir, work = attempt
    op = FailSingle(bad={1}, skip_op_error=True, work_dir=work)
    empty = {"id": [], "text": [], ROW_COLUMN: [], "__dj__stats__": [], "__dj__source_file__": []}
    assert op.process(batch(2).slice(1, 1)) == empty
    assert op.process(batch(1))["text"] == ["T0"]
    assert [(r["n"], r["type"]) for r in records(attempt_dir)] == [(1, "KeyError")]


def test_a_filter_s_stats_and_keep_decision(attempt):
    attempt_dir, work = attempt
    op = StatsFilter(bad={4, 9}, skip_op_error=True, work_dir=work, batch_size=16)
    stats = op.compute_stats(batch(16, stats=True))
    assert stats["id"] == [i for i in range(16) if i not in (4, 9)]
    keep = op.process(pa.table(stats))
    assert keep == [i % 2 == 0 for i in stats["id"]]
    assert sorted(r["n"] for r in records(attempt_dir)) == [4, 9]


def test_adaptive_batching_bisects_a_failing_micro_batch(attempt):
    attempt_dir, work = attempt
    op = AdaptiveFailIds(bad={17}, skip_op_error=True, work_dir=work, batch_size=64)
    out = op.process(batch(64))
    assert out["id"] == [i for i in range(64) if i != 17]
    assert [r["n"] for r in records(attempt_dir)] == [17]
