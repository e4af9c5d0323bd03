"""Matrix row 4: ENOSPC / EDQUOT on write, fsync and close.

The injected errors look like the real calls' (os.write/os.fsync/os.close name no file), so
these tests also prove that the job directory code adds the path to the message.
"""

from __future__ import annotations

import json

import pytest

from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.task_queue import read_lease
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

from .conftest import run_driver
from .crashpoints import FaultRule, injected
from .fakes import LEASE, fsio_runner, merged_ids, prepare

FIRST = "part-00000-of-00004"
MESSAGES = {"ENOSPC": "No space left on device", "EDQUOT": "Disk quota exceeded"}


@pytest.mark.parametrize(
    "op, errno, path",
    [
        ("write", "ENOSPC", "output.jsonl"),
        ("fsync", "ENOSPC", "output.jsonl"),
        ("close", "ENOSPC", "output.jsonl"),
        ("write", "EDQUOT", "output.jsonl"),
        ("close", "EDQUOT", "result.json"),
        ("fsync", "ENOSPC", "result.json"),
    ],
)
def test_full_disk_is_a_failed_attempt_naming_the_path_and_no_done_marker(tmp_path, op, errno, path):
    job = prepare(tmp_path)
    rule = FaultRule(op, errno, path=[f"attempts/{FIRST}/", path], times=None)  # every attempt of the first shard
    with injected(rule) as plan:
        summary = run_worker(job, WorkerIdentity.current("n"), fsio_runner(), WorkerSettings(max_retries=1, **LEASE))
    assert plan.injected, "the fault was reached"
    layout = JobLayout(job)
    assert not layout.done(FIRST).exists()
    assert summary.done == 3 and summary.failed == 2, "counted as failed attempts, retried within the budget"
    ((shard, error),) = summary.terminal_failures
    assert shard == FIRST and MESSAGES[errno] in error and path in error, error
    for gen in (1, 2):
        failure = json.loads((job / "failures" / FIRST / f"gen-00000{gen}.json").read_bytes())
        assert path in failure["error"] and failure["error_type"] == "OSError"
    assert read_lease(layout, FIRST).release is not None, "the claim was handed back"
    assert not list(job.rglob(f".{path}.tmp-*")), "no temp file is left behind"


def test_a_transient_full_disk_is_retried_and_the_job_completes(tmp_path):
    job = prepare(tmp_path)
    with injected(FaultRule("close", "ENOSPC", path="output.jsonl", times=1)):
        summary = run_worker(job, WorkerIdentity.current("n"), fsio_runner(), WorkerSettings(max_retries=1, **LEASE))
    assert summary.complete and summary.failed == 1 and summary.done == 4
    result = merge_job(job, tmp_path / "out.jsonl")
    assert merged_ids(result.output_path) == list(range(40))


def test_disk_full_for_every_record_stops_the_worker_with_one_clear_error(tmp_path):
    """Nothing can be created after the first claim: not even the failure record. Exit 2 with
    the path, never a traceback; no done marker."""
    job = prepare(tmp_path)
    faults = [{"op": "create", "errno": "ENOSPC", "skip": 1, "times": None}]
    proc = run_driver("worker", job, faults=faults)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "No space left on device" in last and str(job) in last, last
    assert "Traceback" not in proc.stderr
    assert not (job / "done").exists() or not list((job / "done").iterdir())
