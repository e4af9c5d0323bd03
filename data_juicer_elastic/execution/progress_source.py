"""A running attempt's live progress, sampled from Ray Data's own execution metrics by a thread that
never raises into the run.  What the numbers mean: docs/status.md, "Where the numbers come from".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.compat import ray_internals
from data_juicer_elastic.jobdir.heartbeats import PeriodicThread, ProgressTracker, Stage

SOURCE: Final = "ray-data"
SAMPLE_SECS: Final = 0.5  # how often the executor's metrics are read (in memory; files follow the heartbeat)
MAX_FAILURES: Final = 3  # consecutive-or-not sampling errors before giving up for the attempt
# Physical operators (or fused parts) that only read or inspect the input.
_READ_PARTS: Final = ("Read", "SplitBlocks")
_LOAD_PARTS: Final = (*_READ_PARTS, "Input", "limit=", "Limit", "Project", "AggregateNumRows")
_RAY_STAGES: Final = frozenset({Stage.STARTING, Stage.LOADING, Stage.PROCESSING, Stage.EXPORTING})


def classify(operator_names: list[str]) -> Stage:
    """The attempt stage a Ray Data execution with these physical operators belongs to."""
    parts = [part for name in operator_names for part in name.split("->")]
    if any(part.startswith("Write") for part in parts):
        return Stage.EXPORTING
    if all(part.startswith(_LOAD_PARTS) for part in parts):
        return Stage.LOADING
    return Stage.PROCESSING


@contextlib.contextmanager
def ray_data_progress(tracker: ProgressTracker | None, interval_secs: float = SAMPLE_SECS) -> Iterator[None]:
    """Sample the Ray Data executions this process runs inside the block into ``tracker`` (if any).
    Nothing is registered with Ray (a DataContext callback class would be pickled into every read
    task); a worker process runs one attempt at a time, so every executor seen is this attempt's."""
    if tracker is None:
        yield
        return
    thread = PeriodicThread(interval_secs, _Sampler(tracker).sample, f"progress-{tracker.claim.shard_id}", join_secs=5)
    thread.start()
    try:
        yield
    finally:
        thread.stop()


class _Sampler:
    def __init__(self, tracker: ProgressTracker):
        self.tracker = tracker
        self.executor: Any = None  # the execution being followed
        self.stage: Stage | None = None
        self.failures = 0

    def sample(self) -> None:
        if self.failures >= MAX_FAILURES:
            return
        try:
            live = ray_internals.live_executors()
            if self.executor is not None and (self.executor not in live or live[-1:] != [self.executor]):
                self._report(self.executor)  # it ended (or a newer one started): record its final counts
                self.executor = None
            if live:
                self.executor = live[-1]
                self._report(self.executor)
        except Exception as exc:  # never break the shard for a display
            self.failures += 1
            if self.failures >= MAX_FAILURES:
                self.tracker.update(source="none")
                logger.warning(f"live progress from Ray Data is off for this attempt: {type(exc).__name__}: {exc}")

    def _report(self, executor: Any) -> None:
        tracker = self.tracker
        if tracker.current.stage not in _RAY_STAGES:
            return  # the runner has moved on (canonicalizing): a late sample must not step back
        ops = ray_internals.physical_operators(executor)
        if not ops:
            return
        stage = classify([op.name for op in ops])
        running = next((op for op in ops if not ray_internals.has_completed(op)), ops[-1])
        if stage is not self.stage:
            self.stage = stage
            tracker.set_stage(stage, running.name)
        if stage is Stage.PROCESSING:
            total = tracker.current.rows_total
            if any(part.startswith(_READ_PARTS) for part in ops[0].name.split("->")):
                read = ray_internals.rows_output(ops[0])
            else:
                # The shard was read whole into blocks (execution.shard_reader) before processing:
                # its rows count as read once the first operator's task over their block finished,
                # so the count moves block by block through the shard, not all at once at its start.
                read = ray_internals.rows_input_done(ops[0])
            out = ray_internals.rows_output(ops[-1])
            tracker.update(rows_read=min(read, total), rows_written=out, operator=running.name, source=SOURCE)
        else:
            tracker.update(operator=running.name)


def note_stage(tracker: ProgressTracker | None, stage: Stage, *, rows_written: int | None = None) -> None:
    """A stage of the runner's own (after Ray Data, so the whole shard was read), and the exact output rows."""
    if tracker is not None:
        tracker.set_stage(stage)
        if rows_written is not None:
            tracker.update(rows_read=tracker.current.rows_total, rows_written=rows_written)
