"""Live progress records (jobdir/heartbeats.py): bounded writes, bounded samples, strict parsing, the
worker loop writing them on the heartbeat, and the Ray Data stage classification."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from data_juicer_elastic.execution.progress_source import classify
from data_juicer_elastic.jobdir import heartbeats, task_queue
from data_juicer_elastic.jobdir.attempts import ShardOutput
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.rows.shard_source import iter_source_lines
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.sharedfs import fault_seam

from .conftest import FakeClock, identity, make_rows, request, write_rows

SHARD = "part-00000-of-00001"


def _tracker(tmp_path, clock=None):
    layout = JobLayout(tmp_path)
    view = task_queue.read_lease(layout, SHARD)
    claim = task_queue.publish_claim(layout, view, identity("n1"), "att-1", "none")
    tracker = heartbeats.ProgressTracker(layout, claim, 100, clock=clock or FakeClock())
    tracker.update(rows_read=0)  # nothing changes: still nothing to write
    assert not tracker.flush()
    layout.attempt_dir(SHARD, "att-1").mkdir(parents=True)
    tracker.start_writing()
    return layout, tracker


def test_writes_from_the_first_change_on_and_keeps_a_bounded_sample_history(tmp_path):
    clock = FakeClock(0.0)
    layout, tracker = _tracker(tmp_path, clock)
    assert not tracker.flush(), "nothing happened yet: the first heartbeat writes nothing"
    assert heartbeats.read_attempt_progress(layout, SHARD, "att-1") == (None, None)
    tracker.set_stage(heartbeats.Stage.PROCESSING, "MapBatches(x)")
    for k in range(1, 201):
        clock.advance(1.0)
        tracker.update(rows_read=k // 2, rows_written=k // 4, source="ray-data")
        tracker.flush()
    clock.advance(50.0)
    assert tracker.flush(), "no new rows, still written: elapsed_secs must stay current for rates"
    record, error = heartbeats.read_attempt_progress(layout, SHARD, "att-1")
    assert error is None and record.stage == "processing" and record.operator == "MapBatches(x)"
    assert (record.rows_read, record.rows_written, record.rows_total) == (100, 50, 100)
    assert record.elapsed_secs == pytest.approx(250.0) and record.seq == 201
    assert len(record.samples) <= heartbeats.MAX_SAMPLES
    assert record.samples[0][0] == 1.0, "the first sample survives thinning"
    assert record.samples[-1] == [200.0, 100.0, 50.0], "a sample per change of the counts only"
    assert [s[0] for s in record.samples] == sorted(s[0] for s in record.samples)
    path = layout.attempt_progress(SHARD, "att-1")
    assert path.read_bytes().count(b"\n") == 1, "one compact line"
    tracker.finish()
    assert heartbeats.read_attempt_progress(layout, SHARD, "att-1")[0].stage == "finished"


def test_a_malformed_or_foreign_record_is_an_error_never_progress(tmp_path):
    layout, tracker = _tracker(tmp_path)
    tracker.update(rows_read=5)
    tracker.flush()
    path = layout.attempt_progress(SHARD, "att-1")
    good = json.loads(path.read_text())
    for bad in (b"{", json.dumps({**good, "version": 2}).encode(), json.dumps({**good, "rows_read": "5"}).encode()):
        path.write_bytes(bad)
        record, error = heartbeats.read_attempt_progress(layout, SHARD, "att-1")
        assert record is None and error
    path.write_text(json.dumps({**good, "attempt_id": "other"}))
    assert heartbeats.read_attempt_progress(layout, SHARD, "att-1")[0] is None


def test_nothing_is_written_before_the_attempt_directory_is_ready(tmp_path):
    layout = JobLayout(tmp_path)
    claim = task_queue.publish_claim(layout, task_queue.read_lease(layout, SHARD), identity(), "att-2", "none")
    tracker = heartbeats.ProgressTracker(layout, claim, 10)
    tracker.update(rows_read=3)
    tracker.finish()
    assert not layout.attempt_dir(SHARD, "att-2").exists(), "never creates a directory (planted links)"


def test_write_errors_are_logged_not_raised_and_retried(tmp_path):
    layout, tracker = _tracker(tmp_path)
    tracker.update(rows_read=1)

    def refuse(op, path):
        if path.name.startswith("progress"):
            raise OSError(28, "No space left on device")

    fault_seam.set_fault_hook(refuse)
    try:
        assert tracker.flush() is False
    finally:
        fault_seam.set_fault_hook(None)
    assert tracker.flush() is True, "still dirty: the next heartbeat writes it"


def test_worker_loop_writes_progress_on_the_heartbeat_and_at_the_end(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(8))
    job = tmp_path / "job"
    prepare_job(request(job, data, 1))
    seen = []

    def runner(task):
        tracker = heartbeats.current()
        seen.append(tracker)
        tracker.set_stage(heartbeats.Stage.PROCESSING, "MapBatches(slow)")
        tracker.update(rows_read=3, rows_written=2, source="test")
        deadline = time.monotonic() + 10
        path = JobLayout(job).attempt_progress(task.shard_id, task.attempt_id)
        while not path.exists() and time.monotonic() < deadline:  # the heartbeat thread writes it
            time.sleep(0.05)
        live = json.loads(path.read_text())
        assert (live["stage"], live["rows_read"], live["rows_written"]) == ("processing", 3, 2)
        out = task.attempt_dir / "output.jsonl"
        out.write_bytes(b"".join(line + b"\n" for line in iter_source_lines(task.source)))
        return ShardOutput(out, 8)

    summary = run_worker(
        job, identity(), runner, WorkerSettings(ttl_secs=2.0, heartbeat_secs=0.2, max_retries=0, poll_interval_secs=0.1)
    )
    assert summary.done == 1 and seen[0] is not None and heartbeats.current() is None
    (attempt,) = (job / "attempts" / SHARD).iterdir()
    record, _ = heartbeats.read_attempt_progress(JobLayout(job), SHARD, attempt.name)
    assert record.stage == "finished" and record.rows_total == 8 and record.node_id == "node-a"


@pytest.mark.parametrize(
    ("names", "stage"),
    [
        (["ReadJSONStream->SplitBlocks(4)", "limit=1"], heartbeats.Stage.LOADING),
        (["ReadJSONStream->SplitBlocks(4)", "Project", "AggregateNumRows"], heartbeats.Stage.LOADING),
        (["ReadJSONStream->SplitBlocks(4)", "MapBatches(process_batched)->MapBatches(filter_batch)"], "processing"),
        (["ReadJSON->MapBatches(process_batched)"], heartbeats.Stage.PROCESSING),
        (["Write"], heartbeats.Stage.EXPORTING),
    ],
)
def test_ray_data_executions_are_classified_by_their_operators(names, stage):
    assert classify(names) == stage


class _Op:
    """A Ray Data physical operator as the sampler reads it: its name, whether it completed, its
    metrics (rows handed to its tasks, the tasks still running with their input rows, rows out)."""

    def __init__(self, name: str):
        self.name, self.completed = name, False
        self.metrics = SimpleNamespace(
            rows_inputs_of_submitted_tasks=0, _running_tasks={}, rows_task_outputs_generated=0
        )

    def has_completed(self) -> bool:
        return self.completed

    def submit(self, task: int, rows: int) -> None:
        self.metrics.rows_inputs_of_submitted_tasks += rows
        self.metrics._running_tasks[task] = SimpleNamespace(inputs=SimpleNamespace(num_rows=lambda: rows))

    def finish(self, task: int, rows_out: int) -> None:
        del self.metrics._running_tasks[task]
        self.metrics.rows_task_outputs_generated += rows_out


def test_rows_read_from_blocks_read_before_processing_move_block_by_block(tmp_path, monkeypatch):
    """The shard read into blocks before processing (no Read operator in the pass): its rows count
    as read once the task over their block finished, not all at the pass's start."""
    from data_juicer_elastic.compat import ray_internals
    from data_juicer_elastic.execution.progress_source import _Sampler

    _, tracker = _tracker(tmp_path)
    op = _Op("MapBatches(process_batched)->MapBatches(filter_batch)")
    executor = SimpleNamespace(_topology={op: None})
    monkeypatch.setattr(ray_internals, "live_executors", lambda: [executor])
    sampler = _Sampler(tracker)
    seen = []
    for block in range(4):  # four blocks of 25 rows, one task each, one at a time
        op.submit(block, 25)
        sampler.sample()
        seen.append(tracker.current.rows_read)
        op.finish(block, 20)
        sampler.sample()
        seen.append(tracker.current.rows_read)
    assert tracker.current.stage == heartbeats.Stage.PROCESSING and sampler.failures == 0
    assert seen == [0, 25, 25, 50, 50, 75, 75, 100], seen
    assert tracker.current.rows_written == 80


def test_a_traversing_attempt_id_is_an_error_not_a_path(tmp_path):
    layout = JobLayout(tmp_path)
    record, error = heartbeats.read_attempt_progress(layout, SHARD, "../../../../tmp/evil")
    assert record is None and "invalid attempt id" in error
