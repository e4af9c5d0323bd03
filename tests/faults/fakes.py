"""A fast stand-in for the Ray shard runner and a small job, shared by the fault tests and
the worker driver (``python -m tests.faults.driver``).

The runner copies each input row, tagged with the attempt that wrote it, to
``attempt_dir/output.jsonl`` through ``sharedfs.fsio``'s checked writer, so every
injected write/fsync/close fault and the ``write``/``fsync`` crash points reach it
exactly as they reach the real runner's output.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from data_juicer_elastic.dedup.keys import exact_keys
from data_juicer_elastic.dedup.stages import ACCEPTED, dedup_stages
from data_juicer_elastic.jobdir import heartbeats
from data_juicer_elastic.jobdir.attempts import ShardOutput, ShardTask, SignatureOutput, SignatureTask
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


def prepare(
    tmp: Path, rows: int = 40, shards: int = 4, name: str = "job", copy_shards: bool = True, process: list | None = None
) -> Path:
    """A prepared (planned and scanned) job; its shards copied into the job dir unless ``copy_shards``
    is False (then read in place from the input file, ``<name>-input.jsonl``)."""
    data = (write_dedup_input if process else write_input)(tmp / f"{name}-input.jsonl", rows)
    job = tmp / name
    prepare_job(
        PrepareRequest(
            job_dir=job,
            dataset_path=data,
            num_shards=shards,
            recipe={"process": process or [{"copy_mapper": None}]},
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
        rows = (json.loads(raw) | {"attempt": task.attempt_id} for raw in iter_source_lines(task.source))
        return write_output(task, rows)

    return run


def write_output(task: ShardTask, rows) -> ShardOutput:
    """A fake run's output: ``rows`` as compact JSON lines, written as the real runner writes (checked)."""
    writer = fsio.BufferedCheckedWriter(task.output_path)
    count = 0
    try:
        for row in rows:
            writer.write(json.dumps(row, separators=(",", ":")).encode() + b"\n")
            count += 1
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    return ShardOutput(task.output_path, count)


def merged_ids(path: Path) -> list[int]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line)["id"] for line in handle]


def done_shards(job: Path) -> dict[str, dict]:
    directory = job / "done"
    return {p.stem: json.loads(p.read_bytes()) for p in sorted(directory.iterdir())} if directory.exists() else {}


# --- deduplication: exact dedup computed in Python, the phases run on the real task queue -------------

# A filter before the first deduplicator (rows that never reach it), then two exact deduplicators: the
# second (lowercase) merges what the first kept apart.
DEDUP_PROCESS = [
    {"text_length_filter": {"min_len": 1}},
    {"document_deduplicator": {}},
    {"document_deduplicator": {"lowercase": True}},
]


def dedup_texts(rows: int) -> list[str]:
    """Copies far apart, case and whitespace variants, empty documents."""
    distinct = max(1, rows // 3)
    texts = []
    for i in range(rows):
        words = f"doc {(i * 7) % distinct}"
        texts.append("" if i % 11 == 5 else (words, words.upper(), f"  {words} ", words + " x")[i % 4])
    return texts


def write_dedup_input(path: Path, rows: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for i, text in enumerate(dedup_texts(rows)):
            handle.write(json.dumps({"id": i, "text": text}) + "\n")
    return path


def _exact_hash(text: str, args: dict | None) -> str:
    """document_deduplicator's compute_hash, for its ``lowercase`` option."""
    return hashlib.md5((text.lower() if (args or {}).get("lowercase") else text).strip().encode()).hexdigest()


def _reaches(process: list, stop: int, text: str, number: int, drops: dict[int, set]) -> bool:
    """Whether input row ``number`` survives ``process[:stop]`` (each deduplicator: its stage's drops)."""
    stage = 0
    for entry in process[:stop]:
        ((name, args),) = entry.items()
        if name == "text_length_filter" and len(text) < (args or {}).get("min_len", 0):
            return False
        if name in ACCEPTED:
            stage += 1
            if number in drops.get(stage, ()):
                return False
    return True


def _drop_sets(task) -> dict[int, set]:
    return {stage: set(rows.tolist()) for stage, rows in task.drops.items()}


def fake_signatures(process: list, fails: set[int] = frozenset()) -> Callable[[SignatureTask], SignatureOutput]:
    """run_signatures: the rows reaching the stage's deduplicator and their md5 as exact keys.  ``fails``:
    input row ids whose hashing raises in stage 1, quarantined in the attempt's ``errors.jsonl`` (the
    line a real run writes: op ``elastic_dedup_hash``, the input row byte for byte) and listed as failed."""
    stages = dedup_stages(process)

    def run(task: SignatureTask) -> SignatureOutput:
        stage, drops = stages[task.stage - 1], _drop_sets(task)
        rows, hashes, failed, lines = [], [], [], []
        for number, raw in enumerate(iter_source_lines(task.source)):
            row = json.loads(raw)
            if not _reaches(process, stage.position, row["text"], number, drops):
                continue
            if task.stage == 1 and row["id"] in fails:
                failed.append(number)
                head = {"row_number": row["id"], "shard": task.shard_id, "shard_row": number,
                        "op": "elastic_dedup_hash", "op_index": stage.position, "error_type": "ValueError",
                        "error": "hashing failed"}  # fmt: skip
                line = json.dumps(head, separators=(",", ":"))[:-1].encode() + b',"row":' + bytes(raw).rstrip(b"\n")
                lines.append(line + b"}\n")
                continue
            rows.append(number)
            hashes.append(_exact_hash(row["text"], stage.args))
        errors = None
        if lines:
            errors = Path(task.attempt_dir) / "errors.jsonl"
            fsio.atomic_write(errors, b"".join(lines))
        return SignatureOutput(
            np.array(rows, dtype=np.uint64), exact_keys(hashes), "exact",
            failed=np.array(failed, dtype=np.uint64), errors_path=errors,
        )  # fmt: skip

    return run


def dedup_runner(process: list) -> Callable[[ShardTask], ShardOutput]:
    """run_shard: the rows that survive the whole recipe (every stage's drop list applied)."""

    def run(task: ShardTask) -> ShardOutput:
        drops = _drop_sets(task)
        rows = (json.loads(raw) for raw in iter_source_lines(task.source))
        return write_output(task, (row for number, row in enumerate(rows)
                                   if _reaches(process, len(process), row["text"], number, drops)))  # fmt: skip

    return run


def dedup_oracle(texts: list[str], process: list) -> list[int]:
    """The ids the default executor keeps: each operator over the whole dataset, each deduplicator
    keeping the first row of each hash."""
    kept = list(range(len(texts)))
    for entry in process:
        ((name, args),) = entry.items()
        if name == "text_length_filter":
            kept = [i for i in kept if len(texts[i]) >= (args or {}).get("min_len", 0)]
        elif name in ACCEPTED:
            seen: set[str] = set()
            kept = [
                i for i in kept if not (_exact_hash(texts[i], args) in seen or seen.add(_exact_hash(texts[i], args)))
            ]
    return kept
