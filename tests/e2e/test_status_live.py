"""`dj-elastic status` on a real job while it runs: one shard fails terminally, one fails once and is
retried, one is running (slow rows) -- through `dj-elastic prepare`, `worker` and `status` subprocesses,
real Ray, live progress from Ray Data's metrics.  One job serves every assertion."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from .conftest import OPS_DIR, RAY_CPUS, run

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

ROWS_PER_SHARD = 10
FAIL, FLAKY, SLOW = "part-00000-of-00003", "part-00001-of-00003", "part-00002-of-00003"
SLOW_SECS_PER_ROW = 1.0  # 10 s of processing: time for two status commands on a loaded machine


def _status(job: Path, *args: str) -> subprocess.CompletedProcess:
    return run(["dj-elastic", "status", "--job-dir", str(job), *args], cwd=job.parent, timeout=120)


@pytest.fixture(scope="module")
def live_job(tmp_path_factory):
    """Start the job, wait until the slow shard is running with progress; yield what status said then."""
    tmp = tmp_path_factory.mktemp("status-live")
    data = tmp / "input.jsonl"
    # equal-sized rows, so the byte-balanced split puts exactly ROWS_PER_SHARD rows in each shard
    rows = [json.dumps({"id": i, "text": f"row {i:04d} of the live status job"}) + "\n" for i in range(30)]
    data.write_text("".join(rows))
    job = tmp / "job"
    recipe = {
        "project_name": "status-live",
        "np": 1,
        "executor_type": "elastic_sharded",
        "dataset_path": str(data),
        "export_path": str(tmp / "merged.jsonl"),
        "custom_operator_paths": [str(OPS_DIR / "e2e_ops.py")],
        "skip_op_error": False,
        "process": [
            {"e2e_fail_mapper": {"fail_id": 3}},
            {"e2e_flaky_mapper": {"fail_id": 13, "marker_dir": str(tmp)}},
            {"e2e_slow_ids_mapper": {"seconds_per_row": SLOW_SECS_PER_ROW, "first_id": 20, "end_id": 30}},
        ],
        "elastic": {
            "job_dir": str(job),
            "num_shards": 3,
            "ray_num_cpus": RAY_CPUS,
            "max_retries": 1,
            "lease_ttl_secs": 10,
            "heartbeat_interval_secs": 0.5,
            "poll_interval_secs": 0.5,
        },
    }
    (tmp / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    # prepare + worker (not dj-process: a run aborts every instance at the first terminal failure,
    # and this job must go on to the retried and the running shard)
    prepared = run(["dj-elastic", "prepare", "--config", str(tmp / "recipe.yaml"), "--scan"], cwd=tmp)
    assert prepared.returncode == 0, prepared.stdout[-3000:] + prepared.stderr[-3000:]
    from data_juicer_elastic.jobdir.manifest import load_manifest

    assert [(e.first_row, e.rows) for e in load_manifest(job).shards] == [(0, 10), (10, 10), (20, 10)]
    # the prepare wrote manifest-rows.json beside the manifest: what status reads of each shard
    assert (job / "manifest-rows.json").is_file()
    light = load_manifest(job, entries=False)
    assert [(e.shard_id, e.rows) for e in light.shards] == [(e.shard_id, e.rows) for e in load_manifest(job).shards]
    log = open(tmp / "worker.out", "w")  # a file, not a pipe: a full pipe nobody reads blocks the worker
    proc = subprocess.Popen(
        ["dj-elastic", "worker", "--job-dir", str(job)],
        cwd=tmp,
        env={**os.environ, "DJ_ELASTIC_NODE_ID": "node-live"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        live = None
        deadline = time.monotonic() + 240
        while live is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            # cheap wait on the file itself; then the real command, while the shard still runs
            progress = list((job / "attempts").glob(f"{SLOW}/*/progress.json"))
            if not progress or json.loads(progress[0].read_text())["stage"] != "processing":
                continue
            snap = _status(job, "--json")
            live = (snap, json.loads(snap.stdout), _status(job))
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    out = (tmp / "worker.out").read_text()
    assert live is not None, f"never saw {SLOW} running with progress; the worker said:\n{out[-4000:]}"
    yield job, proc.returncode, out, live


@pytest.mark.extended
def test_status_while_running_shows_failed_retried_running_and_rates(live_job):
    job, _, _, (snap, data, text) = live_job
    assert snap.returncode == 2, "a terminally failed shard: exit 2 even while others run"
    assert data["counts"] == {"pending": 0, "running": 1, "stale": 0, "done": 1, "failed": 1}
    assert data["rows_total"] == 30 and data["rows_done"] == ROWS_PER_SHARD and data["retried"] == 1
    shards = {s["shard_id"]: s for s in data["shards"]}
    flaky = shards[FLAKY]
    if data["source"] == "summary":  # a done shard's records are not read: failures some, attempts unknown
        assert flaky["state"] == "done" and flaky["failures"] is None and flaky["attempts"] is None
    else:
        assert flaky["state"] == "done" and flaky["failures"] == 1 and flaky["attempts"] == 2

    (failed,) = data["failed"]
    assert failed["shard_id"] == FAIL and failed["failures"] == 2
    assert "refusing row id 3" in failed["error"]
    log = Path(failed["log_path"])
    assert log.is_file() and "refusing row id 3" in log.read_text(), "the log of the last failed attempt"

    slow = shards[SLOW]
    progress = slow["progress"]
    # The shard (one block of 10 small rows, read before processing) counts as read once the
    # operator's task over that block has finished: while the slow operator runs, none yet, or
    # all of it just before the shard moves on.
    assert progress["source"] == "ray-data" and progress["rows_total"] == ROWS_PER_SHARD
    assert progress["rows_read"] in (0, ROWS_PER_SHARD) and progress["rows_written"] <= ROWS_PER_SHARD
    assert progress["operator"] and "MapBatches" in progress["operator"]
    assert progress["elapsed_secs"] > 0 and data["rows_in_progress"] == progress["rows_read"]
    # The node finished a shard, so a running attempt counts at least at the node's pace before its
    # first rows are read (docs/status.md): a rate and an ETA whatever the slow shard has read.
    assert data["rows_per_sec"] > 0 and data["eta_secs"] is not None
    (node,) = data["nodes"]
    assert node["node_id"] == "node-live" and node["running"] == 1 and node["shards_done"] == 1

    assert text.returncode == 2
    out = text.stdout
    assert f"{SLOW} running" in out and "stage=processing" in out and "rows/s now" in out
    assert "failed:" in out and str(log) in out and "(retried 1)" in out and "node-live" in out


@pytest.mark.extended
def test_after_the_run_status_and_progress_records_tell_how_it_ended(live_job):
    job, returncode, out, _ = live_job
    assert returncode == 2, out[-3000:]  # the worker finished what it could; one shard failed terminally
    proc = _status(job, "--json")
    assert proc.returncode == 2
    data = json.loads(proc.stdout)
    assert data["counts"] == {"pending": 0, "running": 0, "stale": 0, "done": 2, "failed": 1}
    assert data["eta_secs"] is None and data["rows_per_sec"] == 0
    from data_juicer_elastic.jobdir.heartbeats import read_attempt_progress
    from data_juicer_elastic.jobdir.layout import JobLayout

    for shard in (FLAKY, SLOW):
        result = json.loads((job / "done" / f"{shard}.json").read_text())
        record, error = read_attempt_progress(JobLayout(job), shard, result["attempt_id"])
        assert error is None and record.stage == "finished", shard
        assert (record.rows_read, record.rows_written) == (ROWS_PER_SHARD, result["rows"])
        assert record.samples and record.samples[-1][1:] == [ROWS_PER_SHARD, result["rows"]]


@pytest.mark.extended
def test_watch_refreshes_until_interrupted(live_job):
    job = live_job[0]
    proc = subprocess.Popen(
        ["dj-elastic", "status", "--job-dir", str(job), "--watch", "0.2", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT as a terminal's Ctrl-C delivers it, whatever this process inherited: a parent
        # that ignores SIGINT (nohup, a background job of a non-interactive shell) passes that on.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [json.loads(line)["counts"]["failed"] for line in lines] == [1, 1], "one JSON document per refresh"
    assert proc.returncode == 2, "the exit code of the last refresh"
