"""`dj-elastic status` while a job runs, through the real command: two worker processes (the fault
driver: the package's worker loop, leases, summary and progress writers, the fake runner, which
reports its rows as the Ray runner does) run shards shorter than the heartbeats, as most are.

While they run, status must see the running attempts' rows (a rate, an ETA), must not call the
last shard done so far the job's last, and its per-node rows must add up to the done count."""

from __future__ import annotations

import json
import os
import re
import signal
import time

from tests.faults.conftest import dj_elastic_status, start_driver
from tests.faults.fakes import done_shards, prepare

SHARDS, ROWS = 8, 80
# TTL 60 s: heartbeats every 15 s, so a 3 s shard ends before its second renewal
WORKER = ["--ttl", "60", "--sleep", "3"]


def _shows_running_rows(data: dict) -> bool:
    """A running attempt whose progress record says it has read rows (the fake runner reports them
    when it starts processing: without the record written by then, none ever does)."""
    running = [s for s in data["shards"] if s["state"] == "running" and s["progress"]]
    return not data["complete"] and any(s["progress"]["rows_read"] > 0 for s in running)


def test_status_while_running_reports_the_running_rows_rate_eta_and_reconciled_nodes(tmp_path):
    job = prepare(tmp_path, ROWS, SHARDS)
    procs = [start_driver("worker", job, *WORKER, node=f"node-{k}") for k in range(2)]
    seen = None
    try:
        deadline = time.monotonic() + 120
        while seen is None and time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.3)
            if not done_shards(job):
                continue  # a shard done first: then "last shard done" has something to say
            data = json.loads(dj_elastic_status(job, "--json").stdout)
            if not _shows_running_rows(data):
                continue  # between shards, or an attempt claimed ahead that has not started yet
            text = dj_elastic_status(job).stdout
            # still running a moment later, and a worker's pace record names its latest result
            if re.search(r"shards: pending \d+, running [1-9]", text) and "last shard done" in text:
                seen = (data, text)
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert seen is not None, "status never showed a running attempt's rows: " + procs[0].stderr.read()[-3000:]
    data, text = seen
    assert data["rows_per_sec"] > 0 and data["eta_secs"] is not None and data["rows_in_progress"] > 0
    assert sum(n["shards_done"] for n in data["nodes"]) == data["counts"]["done"], data["nodes"]
    assert sum(n["rows_done"] for n in data["nodes"]) == data["rows_done"], data["nodes"]
    assert "ETA unknown" not in text and "0.0 rows/s now" not in text, text
    assert "last shard done so far after" in text and "last shard done after" not in text, text

    final = dj_elastic_status(job, "--json")
    assert final.returncode == 0 and json.loads(final.stdout)["complete"]
    assert "last shard done after" in dj_elastic_status(job).stdout, "once every shard is done it is the last"


def test_a_shard_that_has_not_reported_rows_yet_runs_at_its_nodes_pace(tmp_path):
    """One worker whose shards report no row for their first two thirds: once the node has an
    accepted result, status from the job summary never says 0 rows/s or an unknown ETA while a
    shard runs (the shard counts at the pace of the node's accepted attempts until it reports its
    own rows; before the summary's first round status walks the job directory, which counts
    running attempts alone)."""
    job = prepare(tmp_path, 80, 8)
    proc = start_driver("worker", job, "--ttl", "60", "--sleep", "2", "--rows-late", node="node-0")
    silent = []  # snapshots in which every running attempt had reported no row yet
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            data = json.loads(dj_elastic_status(job, "--json").stdout)
            running = [s for s in data["shards"] if s["state"] == "running"]
            silence = running and all(not (s["progress"] or {}).get("rows_read") for s in running)
            if data["source"] == "summary" and data["counts"]["done"] and silence:
                silent.append(data)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert silent, "no snapshot caught a running shard before its first rows"
    for data in silent:
        assert data["rows_per_sec"] > 0 and data["eta_secs"] is not None, (data["rows_per_sec"], data["nodes"])
        assert [n["rows_per_sec"] for n in data["nodes"]] == [data["rows_per_sec"]]
