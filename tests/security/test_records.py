"""Records read from a job directory are parsed defensively.

Whatever bytes sit where a record should be (random JSON, wrong types, huge or nested
values, a directory, a file over the size limit, a newer version) the result is a
record or a JobDirError naming the file, never another exception and never success;
and one bad record never stops the workers of a job.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import IntegrityError, JobDirError
from data_juicer_elastic.jobdir import task_queue
from data_juicer_elastic.jobdir.exports import MergeRecord
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import (
    AttemptRecord,
    Claim,
    Failure,
    Heartbeat,
    Manifest,
    Release,
    ShardResult,
    TerminalFailure,
)
from data_juicer_elastic.jobdir.shard_state import job_outcome
from data_juicer_elastic.jobdir.worker import WorkerSettings, keeper_in_loop, run_worker
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.status.job_status import snapshot
from tests.jobdir.conftest import copy_runner, identity

SHARD = "part-00000-of-00004"
KINDS = [Claim, Heartbeat, Release, AttemptRecord, ShardResult, Failure, TerminalFailure, MergeRecord, Manifest]
LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=0.05, max_retries=1)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _parse_is_record_or_job_dir_error(cls, data: bytes):
    try:
        record = cls.parse(data, "the/file.json")
    except JobDirError as exc:
        assert exc.where == "the/file.json"
        return None
    assert isinstance(record, cls)
    return record


@settings(max_examples=100, deadline=None)
@given(cls=st.sampled_from(KINDS), value=json_values)
def test_any_json_value_is_a_record_or_a_job_dir_error(cls, value):
    _parse_is_record_or_job_dir_error(cls, json.dumps(value).encode())


@settings(max_examples=100, deadline=None)
@given(cls=st.sampled_from(KINDS), data=st.binary(max_size=200))
def test_any_bytes_are_a_record_or_a_job_dir_error(cls, data):
    _parse_is_record_or_job_dir_error(cls, data)


VALID_CLAIM = Claim(SHARD, 1, "a1", "node", "host", "boot", 12, "pid:[1]", 1.0, 0, "none")


@settings(max_examples=120, deadline=None)
@given(field=st.sampled_from([f.name for f in dataclasses.fields(Claim)] + ["format", "version"]), value=json_values)
def test_a_claim_with_any_field_replaced_never_parses_to_a_wrong_type(field, value):
    obj = VALID_CLAIM.to_dict()
    obj[field] = value
    record = _parse_is_record_or_job_dir_error(Claim, json.dumps(obj).encode())
    if record is not None:  # accepted only with the declared type (a reason code: a str, or its StrEnum member)
        declared = {"int": int, "str": str, "float": float, "TakeoverReason": str}
        for f in dataclasses.fields(Claim):
            assert isinstance(getattr(record, f.name), declared[f.type])


@pytest.mark.parametrize(
    "data",
    [
        b'{"format": "dj-elastic/claim", "version": 1, "generation": ' + b"9" * 5000 + b"}",  # int too long
        b"[" * 100_000 + b"]" * 100_000,  # nesting deeper than the recursion limit
        b'{"format": "dj-elastic/claim", "version": NaN}',
        b'{"format": "dj-elastic/claim", "version": 1e999}',
        b'\xff\xfe{"format"}',  # not UTF-8
        b'{"format": "dj-elastic/claim", "version": 1, "generation": true}',
        b'{"format": "dj-elastic/claim", "version": 2}',  # newer version
        b'{"format": "someone-else/claim", "version": 1}',
    ],
    ids=["huge-int", "deep-nesting", "nan", "inf", "not-utf8", "bool-as-int", "newer", "foreign"],
)
def test_hostile_claim_bytes_are_job_dir_errors(data):
    assert _parse_is_record_or_job_dir_error(Claim, data) is None


def test_newer_version_is_refused_naming_both_versions():
    obj = {**VALID_CLAIM.to_dict(), "version": 2}
    with pytest.raises(JobDirError) as info:
        Claim.parse(json.dumps(obj).encode(), "c.json")
    assert "version 2" in info.value.message and "version 1" in info.value.message and "upgrade" in info.value.hint


# -- one bad record never stops the workers ---------------------------------------------------------------
def _oversized(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b" " * (fsio.MAX_RECORD_BYTES + 1))


def _directory(path):
    path.mkdir(parents=True)


@pytest.mark.parametrize("plant", [_oversized, _directory], ids=["oversized", "directory"])
def test_a_bad_claim_is_corrupt_and_taken_over_after_ttl_not_a_crash(job, clock, plant):
    layout = JobLayout(job)
    plant(layout.claim(SHARD, 1))
    first = run_worker(
        job,
        identity(),
        copy_runner(),
        WorkerSettings(wait_for_completion=False, **LEASE),
        clock=clock,
        drive_keeper=keeper_in_loop,
    )
    assert first.done == 3 and not first.complete, "the other shards are done; the bad claim is held for a TTL"
    view = task_queue.read_lease(layout, SHARD)
    assert view.claim is None and view.claim_error
    waited = []

    def sleep(secs):
        waited.append(secs)
        clock.advance(secs)

    again = run_worker(
        job, identity(), copy_runner(), WorkerSettings(**LEASE), clock=clock, drive_keeper=keeper_in_loop, sleep=sleep
    )
    assert again.complete and sum(waited) >= LEASE["ttl_secs"]


@pytest.mark.parametrize("plant", [_oversized, _directory], ids=["oversized", "directory"])
def test_a_bad_done_marker_never_counts_and_merge_names_the_shard(job, tmp_path, plant):
    layout = JobLayout(job)
    plant(layout.done(SHARD))
    summary = run_worker(job, identity(), copy_runner(), WorkerSettings(wait_for_completion=False, **LEASE))
    assert summary.done == 3 and not (job / "attempts" / SHARD).exists(), "never run, never replaced"
    # Workers may trust a listed marker name (claiming.py); whoever opens it reports it:
    complete, terminal = job_outcome(layout, load_manifest(job))
    assert not complete and [t.shard_id for t in terminal] == [SHARD]
    assert "corrupt done marker" in terminal[0].last_error
    with pytest.raises(IntegrityError) as info:
        merge_job(job, tmp_path / "out.jsonl")
    assert info.value.where == f"shard {SHARD}"
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("plant", [_oversized, _directory], ids=["oversized", "directory"])
def test_bad_failure_and_heartbeat_records_do_not_crash(job, plant):
    layout = JobLayout(job)
    plant(layout.failure(SHARD, 1))
    plant(layout.failed(SHARD))
    assert task_queue.list_failures(layout, SHARD) == []
    assert task_queue.read_terminal(layout, SHARD)[0] is None
    hb = layout.heartbeat("part-00001-of-00004", 1)
    plant(hb)
    assert task_queue.read_lease(layout, "part-00001-of-00004").heartbeat is None


def test_status_survives_a_claim_with_a_traversing_attempt_id(job):
    layout = JobLayout(job)
    bad = dataclasses.replace(VALID_CLAIM, attempt_id="../../../../tmp/evil")
    layout.claim(SHARD, 1).parent.mkdir(parents=True)
    layout.claim(SHARD, 1).write_bytes(bad.encode())
    snap = snapshot(job, ttl_secs=60)
    assert snap.shards[0].attempt_id == "../../../../tmp/evil"  # shown as recorded, never used as a path
