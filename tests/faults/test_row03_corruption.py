"""Matrix row 3: torn or corrupt data, claim, heartbeat and done files (truncate, flip a byte).

Merge fails naming the shard and expected/actual; a malformed marker never counts as success;
a corrupt claim or heartbeat neither crashes a worker nor hands the shard over before the TTL.
"""

from __future__ import annotations

import json

import pytest

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import Heartbeat
from data_juicer_elastic.jobdir.task_queue import (
    StalenessObserver,
    list_failures,
    publish_claim,
    read_lease,
    takeover_reason,
)
from data_juicer_elastic.jobdir.worker import WorkerSettings, keeper_in_loop, run_worker
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

from .conftest import run_driver
from .fakes import LEASE, fsio_runner, prepare

SHARD = "part-00001-of-00004"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, secs: float) -> None:
        self.now += secs


def _finished_job(tmp_path):
    job = prepare(tmp_path)
    assert run_worker(job, WorkerIdentity.current("n"), fsio_runner(), WorkerSettings(max_retries=0, **LEASE)).complete
    reference = merge_job(job, tmp_path / "reference.jsonl").output_path.read_bytes()
    return job, reference


def _flip(data: bytes, i: int) -> bytes:
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_accepted_output_fails_merge_naming_shard_expected_and_actual(tmp_path, damage):
    job, _ = _finished_job(tmp_path)
    output = job / json.loads((job / "done" / f"{SHARD}.json").read_bytes())["output"]
    data = output.read_bytes()
    output.write_bytes(data[: len(data) // 2 + 1] if damage == "truncate" else _flip(data, len(data) // 2))
    proc = run_driver("merge", job, tmp_path / "out.jsonl")
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert f"shard {SHARD}" in line
    assert ("expected rows=" in line and "found rows=" in line) or "corrupt" in line, line
    assert not (tmp_path / "out.jsonl").exists()


def test_every_single_byte_flip_or_truncation_of_a_done_marker_is_refused_or_harmless(tmp_path):
    """Exhaustive over the marker's bytes: merge raises an ElasticError naming the shard, or
    (a flip in an informational field) produces exactly the correct output. Never success
    with other content, never an unexpected exception."""
    job, reference = _finished_job(tmp_path)
    marker = job / "done" / f"{SHARD}.json"
    original = marker.read_bytes()
    variants = [_flip(original, i) for i in range(len(original))] + [original[:n] for n in range(0, len(original), 5)]
    refused = 0
    for variant in variants:
        marker.write_bytes(variant)
        out = tmp_path / "out.jsonl"
        try:
            result = merge_job(job, out)
        except ElasticError as exc:
            assert SHARD in str(exc), str(exc)
            refused += 1
            continue
        assert out.read_bytes() == reference and result.rows == 40
        out.unlink()
    assert refused > len(variants) // 2, "most damage must be detected"
    marker.write_bytes(original[:-3])
    summary = run_worker(job, WorkerIdentity.current("n"), fsio_runner(), WorkerSettings(max_retries=0, **LEASE))
    assert summary.claimed == 0, "a malformed marker is never replaced by a re-run"
    # A worker's first claim pass lists done/ and trusts the names it finds without parsing them
    # (the claim path's O(1) skip, Claimer._list_done), so it reports the job complete; merge,
    # which validates every marker, is what refuses the corrupt one.
    assert summary.complete and summary.terminal_failures == []
    with pytest.raises(ElasticError, match=SHARD):
        merge_job(job, tmp_path / "never.jsonl")
    assert not (tmp_path / "never.jsonl").exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_corrupt_claim_is_not_taken_over_before_the_ttl_and_does_not_crash_workers(tmp_path, damage):
    job = prepare(tmp_path)
    layout = JobLayout(job)
    other = WorkerIdentity("elsewhere", "other-host", "boot-of-another-kernel", 4242, "pid:[1]")
    claim = publish_claim(layout, read_lease(layout, SHARD), other, other.new_attempt_id(), "none")
    path = layout.claim(SHARD, 1)
    data = path.read_bytes()
    path.unlink()  # claims are immutable hard links; rewrite the bytes in a new inode
    path.write_bytes({"truncate": data[: len(data) // 2], "flip": _flip(data, 12), "empty": b""}[damage])
    assert read_lease(layout, SHARD).claim is None and read_lease(layout, SHARD).claim_error

    clock = Clock()
    first = run_worker(
        job,
        WorkerIdentity.current("n"),
        fsio_runner(),
        WorkerSettings(max_retries=1, wait_for_completion=False, **LEASE),
        clock=clock,
        drive_keeper=keeper_in_loop,
    )
    assert first.done == 3 and not first.complete, "held (corrupt) claim: not taken at once"
    observer = StalenessObserver(LEASE["ttl_secs"], clock)
    me = WorkerIdentity.current("n")
    assert takeover_reason(read_lease(layout, SHARD), me, observer) is None
    clock.sleep(LEASE["ttl_secs"] + 1)
    assert takeover_reason(read_lease(layout, SHARD), me, observer) == "stale"
    second = run_worker(
        job,
        me,
        fsio_runner(),
        WorkerSettings(max_retries=1, **LEASE),
        clock=clock,
        drive_keeper=keeper_in_loop,
        sleep=clock.sleep,
    )
    assert second.complete and read_lease(layout, SHARD).generation == 2
    assert claim.generation == 1


def test_corrupt_heartbeat_of_a_live_holder_is_renewed_and_of_a_dead_one_expires(tmp_path):
    job = prepare(tmp_path)
    layout = JobLayout(job)
    other = WorkerIdentity("elsewhere", "other-host", "boot-of-another-kernel", 4242, "pid:[1]")
    claim = publish_claim(layout, read_lease(layout, SHARD), other, other.new_attempt_id(), "none")
    hb = layout.heartbeat(SHARD, 1)
    hb.parent.mkdir(parents=True, exist_ok=True)
    clock = Clock()
    observer = StalenessObserver(10.0, clock)
    me = WorkerIdentity.current("n")
    for seq in range(1, 6):  # the holder keeps renewing, the observer sees garbage in between
        hb.write_bytes(b'{"format": "dj-elastic/heartbeat", "ver')
        assert takeover_reason(read_lease(layout, SHARD), me, observer) is None
        clock.sleep(6)
        hb.write_bytes(Heartbeat(SHARD, 1, claim.attempt_id, seq, 0.0).encode())
        assert takeover_reason(read_lease(layout, SHARD), me, observer) is None
        clock.sleep(6)
    hb.write_bytes(b"\x00" * 7)  # the holder died leaving a torn heartbeat
    assert takeover_reason(read_lease(layout, SHARD), me, observer) is None
    clock.sleep(10)
    assert takeover_reason(read_lease(layout, SHARD), me, observer) == "stale"


def test_corrupt_failure_and_release_records_do_not_count(tmp_path):
    job = prepare(tmp_path)
    layout = JobLayout(job)
    for kind in ("failures", "releases"):
        path = job / kind / SHARD / "gen-000001.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b'{"format": "dj-elastic/failure", "version": 1, "shard_')
    other = WorkerIdentity("elsewhere", "other-host", "boot-of-another-kernel", 4242, "pid:[1]")
    publish_claim(layout, read_lease(layout, SHARD), other, other.new_attempt_id(), "none")
    view = read_lease(layout, SHARD)
    assert view.release is None and view.failure is None, "a torn release never frees a claim early"
    assert list_failures(layout, SHARD) == []
