"""Matrix row 2: a worker paused (SIGSTOP) for longer than the TTL, then resumed (SIGCONT).

Its shard is taken over after the TTL; when the zombie wakes it must find its lease lost and
abandon (self-fencing), and even a zombie that slipped past the fence can never replace the
accepted result (link() refuses an existing done marker).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time

import pytest

from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.task_queue import publish_claim, read_lease, release_claim
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

from .conftest import run_driver, start_driver
from .fakes import LEASE, done_shards, fsio_runner, merged_ids, prepare

FIRST = "part-00000-of-00002"
TTL = ["--ttl", "3", "--heartbeat", "0.5"]


def _wait_for(predicate, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_zombie_resumed_after_takeover_abandons_and_never_overwrites(tmp_path):
    job = prepare(tmp_path, rows=20, shards=2)
    zombie = start_driver("worker", job, *TTL, "--sleep", "5", node="zombie")
    heartbeat = job / "heartbeats" / FIRST / "gen-000001.json"
    _wait_for(lambda: heartbeat.exists() and (job / "attempts" / FIRST).exists(), zombie)
    os.kill(zombie.pid, signal.SIGSTOP)
    try:
        rescuer = run_driver("worker", job, *TTL, "--sleep", "0.1", node="rescuer")
        assert rescuer.returncode == 0, rescuer.stderr[-3000:]
        accepted = (job / "done" / f"{FIRST}.json").read_bytes()
        record = json.loads(accepted)
        output_sha = hashlib.sha256((job / record["output"]).read_bytes()).hexdigest()
        # generation 2, or later if the rescuer itself self-fenced on a badly loaded machine
        assert record["node_id"] == "rescuer" and record["generation"] >= 2
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    out, err = zombie.communicate(timeout=60)
    assert zombie.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["lost"] == 1 and summary["done"] == 0, summary

    # accepted output never overwritten; exactly one accepted result per shard
    assert (job / "done" / f"{FIRST}.json").read_bytes() == accepted
    assert hashlib.sha256((job / record["output"]).read_bytes()).hexdigest() == output_sha
    assert sorted(done_shards(job)) == [FIRST, "part-00001-of-00002"]
    assert read_lease(JobLayout(job), FIRST).generation == record["generation"]
    # the zombie released only its own generation, and recorded why it stopped
    gen1_claim = json.loads((job / "claims" / FIRST / "gen-000001.json").read_bytes())
    gen1_release = json.loads((job / "releases" / FIRST / "gen-000001.json").read_bytes())
    assert gen1_release["attempt_id"] == gen1_claim["attempt_id"] and gen1_release["reason"] == "abandoned"
    accepted_release = json.loads((job / "releases" / FIRST / f"gen-{record['generation']:06d}.json").read_bytes())
    assert accepted_release["attempt_id"] == record["attempt_id"]
    zombie_record = json.loads((job / "attempts" / FIRST / gen1_claim["attempt_id"] / "attempt.json").read_bytes())
    assert zombie_record["exit_reason"] == "lost"
    merged = run_driver("merge", job, tmp_path / "out.jsonl")
    assert merged.returncode == 0 and merged_ids(tmp_path / "out.jsonl") == list(range(20))


def test_a_zombie_past_its_fence_loses_the_publication_race(tmp_path):
    """Even without fencing, the zombie's publication is refused: done is link()ed, first wins."""
    job = prepare(tmp_path, rows=20, shards=2)
    layout = JobLayout(job)
    entry = load_manifest(job).shard(FIRST)
    zombie_id = WorkerIdentity.current("zombie")
    zombie_claim = publish_claim(layout, read_lease(layout, FIRST), zombie_id, zombie_id.new_attempt_id(), "none")
    zombie_attempt = attempts.open_attempt(layout, zombie_claim, zombie_id)
    (zombie_attempt.dir / "output.jsonl").write_text('{"id": 0}\n')  # a different (wrong) output

    # the zombie's claim is released (as after a takeover): a rescuer runs the shard
    release_claim(layout, zombie_claim, "abandoned")
    summary = run_worker(job, WorkerIdentity.current("rescuer"), fsio_runner(), WorkerSettings(max_retries=1, **LEASE))
    assert summary.complete
    accepted = (job / "done" / f"{FIRST}.json").read_bytes()

    outcome = attempts.publish_done(
        layout, zombie_claim, zombie_attempt.dir / "output.jsonl", input_rows=entry.rows, input_sha256=entry.sha256
    )
    assert not outcome.accepted and outcome.winner.generation == 2
    assert (job / "done" / f"{FIRST}.json").read_bytes() == accepted
