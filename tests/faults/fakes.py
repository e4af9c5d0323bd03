"""A fast stand-in for the Ray shard runner and a small job, shared by the fault tests and
the worker driver (``python -m tests.faults.driver``).

The runner copies each input row, tagged with the attempt that wrote it, to
``attempt_dir/output.jsonl`` through ``sharedfs.fsio``'s checked writer, so every
injected write/fsync/close fault and the ``write``/``fsync`` crash points reach it
exactly as they reach the real runner's output.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

from data_juicer_elastic.jobdir import heartbeats
from data_juicer_elastic.jobdir.attempts import ShardOutput, ShardTask
from data_juicer_elastic.rows.shard_source import iter_source_lines
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job
from data_juicer_elastic.sharedfs import fsio

# Event.wait, not time.sleep: under libfaketime with FAKETIME_DONT_FAKE_MONOTONIC (row 6)
# time.sleep's clock_nanosleep fails with EINVAL; a timed wait works on every set-up.
_never = threading.Event()


def pause(seconds: float) -> None:
    _never.wait(seconds)


LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=0.05)


def write_input(path: Path, rows: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows):
            handle.write(json.dumps({"id": i, "text": f"row {i} " + "x" * (i % 17)}) + "\n")
    return path


def prepare(tmp: Path, rows: int = 40, shards: int = 4, name: str = "job", copy_shards: bool = True) -> Path:
    """A prepared (planned and scanned) job; its shards copied into the job dir unless ``copy_shards``
    is False (then read in place from the input file, ``<name>-input.jsonl``)."""
    data = write_input(tmp / f"{name}-input.jsonl", rows)
    job = tmp / name
    prepare_job(
        PrepareRequest(
            job_dir=job,
            dataset_path=data,
            num_shards=shards,
            recipe={"process": [{"copy_mapper": None}]},
            stage_identities=["copy"],
            copy_shards=copy_shards,
        )
    )
    return job


def fsio_runner(
    seconds: float = 0.0, fail: Callable[[ShardTask], bool] | None = None, rows_late: bool = False
) -> Callable[[ShardTask], ShardOutput]:
    """run_shard: copy rows (adding the attempt id) after ``seconds``; raise when ``fail(task)``.
    ``rows_late``: no row read for the first two thirds of ``seconds``, then all (the Ray runner
    counts a block's rows once its task is through the first operator, seconds into a shard)."""

    def run(task: ShardTask) -> ShardOutput:
        if seconds:
            tracker = heartbeats.current()
            if tracker is not None:  # as the Ray runner reports: the shard read whole, then processed
                tracker.set_stage(heartbeats.Stage.PROCESSING, "FakeRunner")
                tracker.update(rows_read=0 if rows_late else task.input_rows, rows_written=0, source="fake")
            if rows_late:
                pause(2 * seconds / 3)
                if tracker is not None:
                    tracker.update(rows_read=task.input_rows, rows_written=0, source="fake")
                pause(seconds / 3)
            else:
                pause(seconds)
        if fail is not None and fail(task):
            raise RuntimeError(f"fake runner refuses {task.shard_id}")
        writer = fsio.BufferedCheckedWriter(task.output_path)
        rows = 0
        try:
            for raw in iter_source_lines(task.source):
                row = json.loads(raw)
                row["attempt"] = task.attempt_id
                writer.write(json.dumps(row, separators=(",", ":")).encode() + b"\n")
                rows += 1
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        return ShardOutput(task.output_path, rows)

    return run


def merged_ids(path: Path) -> list[int]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line)["id"] for line in handle]


def done_shards(job: Path) -> dict[str, dict]:
    directory = job / "done"
    return {p.stem: json.loads(p.read_bytes()) for p in sorted(directory.iterdir())} if directory.exists() else {}
