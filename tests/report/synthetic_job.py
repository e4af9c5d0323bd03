"""A synthetic job directory with many shards, nodes, retries and failures, written by the real
record writers (prepare_job, publish_claim, open/close_attempt, publish_done, record_failure,
release_claim); only the attempts' wall-clock times are then set to a simulated schedule."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from pathlib import Path

from data_juicer_elastic.jobdir import attempts, heartbeats, task_queue
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import AttemptRecord, Claim, Release, ShardResult
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

RECIPE = {"process": [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 10}}]}
STAGES = ["stage-whitespace-0000", "stage-length-0001"]


def _identity(node: str, pid: int) -> WorkerIdentity:
    return WorkerIdentity(node_id=node, hostname=f"{node}.cluster", boot_id=f"boot-{node}", pid=pid)


def write_input(path: Path, rows: int, seed: int) -> Path:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(json.dumps({"id": i, "text": "word " * rng.randint(2, 40)}) + "\n")
    return path


def build_job(
    root: Path,
    *,
    num_shards: int,
    nodes: int,
    rows_per_shard: int = 2,
    failed: int = 1,
    retried: int = 2,
    running: int = 1,
    seed: int = 0,
    pending: tuple[int, ...] | range = (),
    error: str = "RuntimeError: synthetic failure",
) -> Path:
    """Prepare a job of ``num_shards`` and play a schedule over ``nodes`` nodes: the last ``failed``
    shards fail terminally (max_retries=1), ``retried`` shards fail once then succeed, ``running``
    shards are still running, the shards in ``pending`` were never claimed, the rest are done on the
    first attempt.  Failures record ``error`` and the shard and generation."""
    rng = random.Random(seed)
    data = write_input(root / "input.jsonl", num_shards * rows_per_shard, seed)
    job = root / "job"
    prepare_job(
        PrepareRequest(
            job_dir=job,
            dataset_path=data,
            num_shards=num_shards,
            recipe=RECIPE,
            stage_identities=STAGES,
            settings={"max_retries": 1, "lease_ttl_secs": 120.0},
            versions={"data_juicer": "1.6.1", "data_juicer_elastic": "0.1.0", "python": "3.11"},
            ray={"address": "local"},
            copy_shards=True,  # the schedule copies each shard file as its "output"
        )
    )
    layout = JobLayout(job)
    manifest_shards = json.loads(layout.manifest.read_bytes())["shards"]
    node_free = [0.0] * nodes  # when each node's (one) slot is next free, seconds into the schedule
    plan_failed = set(range(num_shards - failed, num_shards))
    plan_retried = set(range(1, 1 + retried))
    plan_running = set(range(num_shards - failed - running, num_shards - failed))
    plan = []
    for i, entry in enumerate(manifest_shards):
        if i in pending:
            continue
        outcomes = ["done"]
        if i in plan_failed:
            outcomes = ["failed", "failed"]
        elif i in plan_retried:
            outcomes = ["failed", "done"]
        elif i in plan_running:
            outcomes = ["running"]
        for outcome in outcomes:
            node = min(range(nodes), key=lambda n: node_free[n])
            start = node_free[node] + rng.uniform(0.5, 2.0)
            # node 0 is slow: the report must show it
            duration = (entry["rows"] * 20.0 + rng.uniform(5, 30)) * (3.0 if node == 0 else 1.0)
            node_free[node] = start + duration if outcome != "running" else float("inf")
            plan.append((entry, outcome, node, start, start + duration))
    # Shift the schedule so that it ends now: running attempts then look alive (fresh heartbeats).
    last = max([start for _, _, _, start, _ in plan] + [e for _, o, _, _, e in plan if o != "running"], default=0.0)
    shift = time.time() - last - 5.0
    for entry, outcome, node, start, end in plan:
        identity = _identity(f"node-{node:02d}", 1000 + node)
        end = end + shift if outcome != "running" else None
        _play(layout, entry["shard_id"], entry, outcome, identity, start + shift, end, error)
    return job


def _play(layout, shard, entry, outcome, identity, start, end, error) -> None:
    if outcome == "done" and not fsio.list_names(layout.claim_dir(shard)):
        _done_first_try(layout, shard, entry, identity, start, end)
        return
    view = task_queue.read_lease(layout, shard)
    claim = task_queue.publish_claim(
        layout, view, identity, identity.new_attempt_id(), "none" if not view.generation else "failed"
    )
    attempt = attempts.open_attempt(layout, claim, identity)
    if outcome == "done":
        output = attempt.dir / "output.jsonl"
        fsio.atomic_write(output, layout.shard(shard).read_bytes(), durable=False)
        published = attempts.publish_done(layout, claim, output, input_rows=entry["rows"], input_sha256=entry["sha256"])
        attempts.close_attempt(attempt, "done", rows=published.result.rows)
        task_queue.release_claim(layout, claim, "finished")
    elif outcome == "failed":
        error = f"{error} of {shard} gen {claim.generation}"
        task_queue.record_failure(
            layout,
            claim,
            shard_id=shard,
            generation=claim.generation,
            error=error,
            error_type="RuntimeError",
            exit_reason="error",
            max_retries=1,
            reporter=identity,
        )
        attempts.close_attempt(attempt, "failed", error=error)
        task_queue.release_claim(layout, claim, "failed")
    else:
        heartbeats.write_heartbeat(layout, claim, 1)
    record = dataclasses.replace(attempt.record, started_at=start, ended_at=end)
    fsio.atomic_write(attempt.dir / "attempt.json", record.encode(), durable=False)


def _done_first_try(layout: JobLayout, shard: str, entry: dict, identity: WorkerIdentity, start, end) -> None:
    """The files the real path writes for a shard done by its first attempt (same records, same names),
    written directly: the real path's temp files, fsyncs and re-reads cost ~6 ms per shard, which is
    a minute for 10,000 shards on a loaded CI machine."""
    attempt_id = identity.new_attempt_id()
    claim = Claim(
        shard, 1, attempt_id, identity.node_id, identity.hostname, identity.boot_id, identity.pid, "", start, 0, "none"
    )
    _write(layout.claim(shard, 1), claim.encode())
    attempt_dir = layout.attempt_dir(shard, attempt_id)
    output = attempt_dir / "output.jsonl"
    _write(output, None, link_from=layout.shard(shard))  # an identity pipeline's output, as a hard link
    result = ShardResult(
        shard,
        attempt_id,
        1,
        identity.node_id,
        entry["rows"],
        entry["bytes"],
        entry["sha256"],
        layout.relative(output),
        entry["rows"],
        entry["sha256"],
        end,
    )
    _write(attempt_dir / "result.json", result.encode())
    _write(layout.done(shard), None, link_from=attempt_dir / "result.json")
    record = AttemptRecord(
        shard,
        attempt_id,
        1,
        identity.node_id,
        identity.hostname,
        identity.boot_id,
        identity.pid,
        start,
        end,
        entry["rows"],
        "done",
    )
    _write(attempt_dir / "attempt.json", record.encode())
    _write(layout.release(shard, 1), Release(shard, 1, attempt_id, "finished", end).encode())


_made_dirs: set[Path] = set()


def _write(path: Path, data: bytes | None, link_from: Path | None = None) -> None:
    if path.parent not in _made_dirs:  # one mkdir per directory, not one per file
        path.parent.mkdir(parents=True, exist_ok=True)
        _made_dirs.add(path.parent)
    if link_from is not None:
        os.link(link_from, path)
    else:
        path.write_bytes(data)
