"""Matrix row 30: faults in the scan phase, tested like shard runs.

Every shard is scanned (read once, its rows checked, hashed) as a claimable task under
``scans/``, through the same leases, generation fencing, takeover and budgets as shard runs,
and no shard runs before every scan is published and the manifest composed.  Real worker
processes (the fault driver: the real worker loop and scanner, a fake shard runner, no Ray).
"""

from __future__ import annotations

import json
import signal
import time

from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.task_queue import read_lease

from .conftest import run_driver, start_driver
from .fakes import done_shards, merged_ids, write_input

ROWS, SHARDS = 40, 4
FIRST = "part-00000-of-00004"


def _planned(tmp_path):
    data = write_input(tmp_path / "input.jsonl", ROWS)
    job = tmp_path / "job"
    proc = run_driver("prepare", job, data, "--shards", SHARDS, "--plan-only")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (job / "manifest.json").exists()
    return job, data


def _scan_record(job, shard: str) -> dict:
    return json.loads(JobLayout(job).scans.done(shard).read_bytes())


def _assert_exact(job, tmp_path):
    out = tmp_path / "merged.jsonl"
    merged = run_driver("merge", job, out)
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert merged_ids(out) == list(range(ROWS)), "rows out = rows in, in input order"


def test_a_scanner_killed_holding_a_scan_is_taken_over_at_once_and_the_job_completes(tmp_path):
    job, _ = _planned(tmp_path)
    victim = run_driver("worker", job, node="victim", crash="scan-claim")
    assert victim.returncode == -signal.SIGKILL, victim.stderr[-2000:]
    assert not (job / "manifest.json").exists() and not list((job / "claims").iterdir()), "no shard ran"
    rescuer = run_driver("worker", job, node="rescuer")
    assert rescuer.returncode == 0, rescuer.stderr[-2000:]
    view = read_lease(JobLayout(job).scans, FIRST)  # the victim's scan claim (same host, pid gone)
    assert view.generation == 2 and view.claim.takeover_reason == "dead-pid"
    assert _scan_record(job, FIRST)["node_id"] == "rescuer" and _scan_record(job, FIRST)["generation"] == 2
    assert len(done_shards(job)) == SHARDS
    _assert_exact(job, tmp_path)


def test_a_scanner_killed_after_publishing_its_scan_keeps_its_result(tmp_path):
    job, _ = _planned(tmp_path)
    victim = run_driver("worker", job, node="victim", crash="scanned")
    assert victim.returncode == -signal.SIGKILL, victim.stderr[-2000:]
    first = _scan_record(job, FIRST)
    rescuer = run_driver("worker", job, node="rescuer")
    assert rescuer.returncode == 0, rescuer.stderr[-2000:]
    assert _scan_record(job, FIRST) == first and first["node_id"] == "victim", "nobody scans it again"
    assert read_lease(JobLayout(job).scans, FIRST).generation == 1
    assert load_manifest(job).shards[0].sha256 == first["sha256"]
    _assert_exact(job, tmp_path)


def test_a_stalled_scanner_is_taken_over_after_the_ttl_and_abandons_when_it_wakes(tmp_path):
    """SIGSTOP a scanner holding a scan (alive on this host: only the TTL rule applies); another
    worker takes the scan over after the TTL and finishes the job; the zombie, woken, finds its
    lease lost, publishes nothing and exits 0: one scan result per shard, the job exact."""
    job, _ = _planned(tmp_path)
    ttl = ["--ttl", "3", "--heartbeat", "0.5"]
    zombie = start_driver("worker", job, *ttl, "--scan-sleep", "5", node="zombie")
    heartbeat = JobLayout(job).scans.heartbeat(FIRST, 1)
    deadline = time.monotonic() + 60
    while not heartbeat.exists():
        assert zombie.poll() is None and time.monotonic() < deadline, "the zombie never held a scan"
        time.sleep(0.05)
    zombie.send_signal(signal.SIGSTOP)
    try:
        rescuer = run_driver("worker", job, *ttl, node="rescuer")
        assert rescuer.returncode == 0, rescuer.stderr[-2000:]
    finally:
        zombie.send_signal(signal.SIGCONT)
    out, err = zombie.communicate(timeout=120)
    assert zombie.returncode == 0, err[-2000:]
    view = read_lease(JobLayout(job).scans, FIRST)
    assert view.generation >= 2 and view.claim.takeover_reason == "stale"
    assert _scan_record(job, FIRST)["node_id"] == "rescuer"
    assert "abandoning attempt" in err and summary_of_text(out)["done"] == 0
    assert len(done_shards(job)) == SHARDS
    _assert_exact(job, tmp_path)


def summary_of_text(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_a_tampered_scan_record_refuses_the_job_on_every_worker_before_any_shard_runs(tmp_path):
    job, _ = _planned(tmp_path)
    first = run_driver("worker", job, "--max-shards", "1", crash="scanned@4")  # every scan published, then killed
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    record = JobLayout(job).scans.done("part-00002-of-00004")
    data = json.loads(record.read_bytes())
    record.write_text(json.dumps({**data, "rows": data["rows"] + 1}, indent=1))  # parses; the checksum does not match
    for node in ("a", "b"):
        proc = run_driver("worker", job, node=node)
        assert proc.returncode == 2, proc.stderr[-2000:]
        line = proc.stderr.strip().splitlines()[-1]
        assert "corrupt scan record" in line and "checksum" in line and str(record) in line
    assert not (job / "manifest.json").exists() and not list((job / "claims").iterdir()), "no shard ran"


def test_a_malformed_row_refuses_the_job_with_one_error_on_every_instance_and_no_output(tmp_path):
    data = write_input(tmp_path / "input.jsonl", ROWS)
    lines = data.read_text().splitlines()
    lines[27] = '{"id": 27, "text": NaN}'  # in the third shard
    data.write_text("\n".join(lines) + "\n")
    job, out = tmp_path / "job", tmp_path / "out.jsonl"
    runs = [start_driver("run", job, data, out, "--run-id", "r1", "--shards", SHARDS) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in runs]
    lines_seen = {err.strip().splitlines()[-1] for _, err in results}
    assert [code for code, _ in results] == [2, 2], [err[-2000:] for _, err in results]
    (line,) = lines_seen  # the same one error on every instance
    assert f"{data}:28" in line and "NaN" in line
    assert not out.exists() and not (job / "manifest.json").exists() and not list((job / "claims").iterdir())
    outcome = next((job / "coordination").iterdir()) / "outcome.json"
    assert json.loads(outcome.read_bytes())["status"] == "failed"


def test_a_worker_that_may_not_wait_leaves_scans_held_by_others(tmp_path):
    """`--no-wait` during the scan phase: it scans what it can claim and leaves, as it does with shards."""
    job, _ = _planned(tmp_path)
    holder = start_driver("worker", job, "--scan-sleep", "30", node="holder")
    layout = JobLayout(job)
    deadline = time.monotonic() + 60
    while not layout.scans.heartbeat(FIRST, 1).exists():
        assert holder.poll() is None and time.monotonic() < deadline, "the holder never claimed a scan"
        time.sleep(0.05)
    holder.send_signal(signal.SIGSTOP)  # it holds the first scan and does not move
    try:
        proc = run_driver("worker", job, "--no-wait", node="visitor")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout.strip().splitlines()[-1])["stop_reason"] == "no_work"
        assert not (job / "manifest.json").exists() and len(list(layout.scans.done_dir.iterdir())) == SHARDS - 1
    finally:
        holder.kill()
        holder.wait()
