"""The job's times (status/job_times.py) from run records, outcomes and pace records written as
the code writes them: the newest run wins, an earlier run's workers are left out, and the
fallbacks without a run record or without pace records."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.coordination.run import Instance, Outcome, OutcomeStatus, RunRecord
from data_juicer_elastic.jobdir.exports import MergeRecord
from data_juicer_elastic.jobdir.job_summary import PaceRecord
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.status.job_times import format_wall, job_times

INSTANCE = Instance("i-1", "node-a", "host-a", "boot", 1)


def _run(layout: JobLayout, key: str, created: float, decided: float | None, ok: bool = True) -> None:
    fsio.makedirs(layout.run_dir(key))
    fsio.write_new(layout.run_record(key), RunRecord(f"run-{key[:4]}", "derived", created, "i-1").encode())
    if decided is not None:
        status = OutcomeStatus.OK if ok else OutcomeStatus.FAILED
        fsio.write_new(layout.outcome(key), Outcome(f"run-{key[:4]}", status, "finalize", INSTANCE, decided).encode())


def _pace(layout: JobLayout, name: str, first: float, last: float | None, updated: float) -> None:
    fsio.makedirs(layout.paces_dir)
    record = PaceRecord(name, "node-a", "host-a", "boot", "", 1, 1, updated, first_claimed_at=first, last_done_at=last)
    fsio.atomic_write(layout.pace(name), record.encode())


@settings(max_examples=40, deadline=None)
@given(
    first_run=st.floats(0, 1000),
    gap=st.floats(1, 1000),
    claims=st.lists(st.tuples(st.floats(0, 500), st.floats(0, 500)), min_size=1, max_size=5),
    finished=st.booleans(),
)
def test_the_newest_run_and_only_its_workers_give_the_times(tmp_path_factory, first_run, gap, claims, finished):
    layout = JobLayout(tmp_path_factory.mktemp("job"))
    old_key, new_key = "a" * 16, "b" * 16
    second = first_run + gap
    _run(layout, new_key, second, second + 1200 if finished else None)  # listed first or not: order is by time
    _run(layout, old_key, first_run, first_run + 1)
    _pace(layout, "old-worker", first_run + 0.5, first_run + 0.9, first_run + 0.95)  # the earlier run's
    for k, (start, length) in enumerate(claims):
        _pace(layout, f"w{k}", second + start, second + start + length, second + start + length)
    times = job_times(layout)
    assert times.run_id == "run-bbbb" and times.submitted_at == second
    assert times.first_running_at == min(second + s for s, _ in claims)
    assert times.last_done_at == max(second + s + n for s, n in claims)
    assert times.finalized_at == (second + 1200 if finished else None) and times.ok == (True if finished else None)
    if finished:
        assert times.wall_secs() == pytest.approx(1200)
    assert times.wall_secs(now=second + 7) == pytest.approx(1200 if finished else 7)
    assert abs(times.first_shard_secs() - min(s for s, _ in claims)) < 1e-6


def test_without_a_run_the_plan_is_the_submission_and_without_paces_the_attempts_give_the_first(tmp_path):
    layout = JobLayout(tmp_path)
    assert job_times(layout) is None  # neither a run nor a plan time: nothing to say
    times = job_times(layout, planned_at=100.0, attempt_starts=[90.0, 104.5, 120.0])
    assert (times.run_id, times.submitted_at, times.first_running_at, times.last_done_at) == (None, 100.0, 104.5, None)
    assert times.finalized_at is None and times.to_json(now=130.0)["wall_secs"] == 30.0
    _pace(layout, "w", 101.0, 110.0, 110.0)  # pace records, where there are some, are the rule
    times = job_times(layout, planned_at=100.0, attempt_starts=[90.0, 104.5])
    assert (times.first_running_at, times.last_done_at, times.last_shard_secs()) == (101.0, 110.0, 10.0)


def test_an_aborted_run_and_a_corrupt_record_are_told_apart(tmp_path):
    layout = JobLayout(tmp_path)
    _run(layout, "c" * 16, 50.0, 80.0, ok=False)
    fsio.makedirs(layout.run_dir("d" * 16))
    (layout.run_record("d" * 16)).write_text("{not json")  # a corrupt newer record is skipped, not trusted
    times = job_times(layout)
    assert (times.run_id, times.ok, times.wall_secs()) == ("run-cccc", False, 30.0)
    assert [format_wall(x) for x in (23.24, 245, 3723)] == ["23.2s", "4m05s", "1h02m03s"]
    assert replace(times, finalized_at=None).wall_secs(now=51.0) == 1.0


def _merge(layout: JobLayout, merged_at: float) -> None:
    record = MergeRecord("out.jsonl", 1, 1, "0" * 64, "job", "0" * 64, merged_at=merged_at)
    fsio.atomic_write(layout.merge_record, record.encode())


def test_the_merge_finalizes_a_job_without_an_outcome_and_the_latest_end_after_the_results_counts(tmp_path):
    layout = JobLayout(tmp_path)
    _pace(layout, "w", 101.0, 110.0, 110.0)
    _merge(layout, 0.0)  # an old record without its time: no finish, read without error
    assert job_times(layout, planned_at=100.0, complete=True).finalized_at is None
    _merge(layout, 120.0)  # dj-elastic prepare + worker + merge: the merge is the finish
    times = job_times(layout, planned_at=100.0, complete=True)
    assert (times.finalized_at, times.ok, times.wall_secs()) == (120.0, True, 20.0)
    assert job_times(layout, planned_at=100.0, complete=False).finalized_at is None  # shards left: no finish
    _run(layout, "e" * 16, 100.0, 115.0)  # a run finalized before a retry's rerun (last result at 130)
    _pace(layout, "w2", 125.0, 130.0, 130.0)
    assert job_times(layout, complete=False).finalized_at is None
    assert job_times(layout, complete=True).finalized_at is None  # the merge at 120 is before it too
    _merge(layout, 140.0)
    times = job_times(layout, complete=True)
    assert (times.run_id, times.finalized_at, times.ok, times.wall_secs()) == ("run-eeee", 140.0, True, 40.0)


def test_a_re_merge_after_the_run_finalized_moves_nothing_and_a_merge_after_an_abort_ends_the_job(tmp_path):
    layout = JobLayout(tmp_path)
    _pace(layout, "w", 101.0, 110.0, 110.0)
    _run(layout, "1" * 16, 100.0, 115.0)
    _merge(layout, 300.0)  # the export merged again, later: the run had finalized at 115
    assert job_times(layout, complete=True).finalized_at == 115.0
    _run(layout, "2" * 16, 200.0, 210.0, ok=False)  # a newer run aborted with every shard done
    _pace(layout, "w2", 201.0, 205.0, 205.0)
    times = job_times(layout, complete=True)
    assert (times.run_id, times.finalized_at, times.ok) == ("run-2222", 300.0, True)  # dj-elastic merge finished it
    times = job_times(layout, complete=False)
    assert (times.finalized_at, times.ok) == (210.0, False)  # shards left: the abort ended the run, no finalize
