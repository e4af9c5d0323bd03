"""Matrix row 13: permission errors (CI runs as root, so EACCES is injected).

A permission error is this node's problem (its uid, a read-only mount), not the shard's:
the claim is handed back without spending the retry budget and the worker stops at once
with one clear error naming the path, exit 2.  No retry storm.
"""

from __future__ import annotations

import pytest

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.task_queue import read_lease
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

from .conftest import run_driver
from .crashpoints import FaultRule, injected
from .fakes import LEASE, fsio_runner, prepare

FIRST = "part-00000-of-00004"


@pytest.mark.parametrize(
    "op, path, errno",
    [("create", "output.jsonl", "EACCES"), ("makedirs", "/attempts/", "EACCES"), ("open", "/shards/", "EACCES"),
     ("create", "result.json", "EROFS"), ("write", "output.jsonl", "EPERM")],
)  # fmt: skip
def test_permission_error_releases_without_spending_the_budget_and_stops(tmp_path, op, path, errno):
    job = prepare(tmp_path)
    with injected(FaultRule(op, errno, path=path, times=None)) as plan:
        with pytest.raises(JobDirError) as info:
            run_worker(job, WorkerIdentity.current("n"), fsio_runner(), WorkerSettings(max_retries=3, **LEASE))
    assert len(plan.injected) == 1, "one try, no retry storm"
    assert "storage error" in str(info.value) and info.value.where and path.strip("/") in info.value.where
    layout = JobLayout(job)
    assert read_lease(layout, FIRST).release is not None, "the claim was handed back at once"
    assert not (job / "failures").exists() or not list((job / "failures").rglob("*.json")), "budget untouched"
    assert not (job / "done").exists() or not list((job / "done").iterdir())


def test_unwritable_job_dir_exits_2_with_the_path(tmp_path):
    job = prepare(tmp_path)
    proc = run_driver("worker", job, faults=[{"op": "create", "errno": "EACCES", "path": "/claims/", "times": None}])
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert "Permission denied" in line and f"{job}/claims/" in line and "Traceback" not in proc.stderr
