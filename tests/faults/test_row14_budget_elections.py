"""Matrix row 14: retry budget, elections, finalize.

An always-failing shard is tried max_retries + 1 times, then marked failed and the worker
exits 2; 8 concurrent preparers with the winner killed still give exactly one prepare; a
killed finalizer is finished by a resubmission, and finalizing again is a no-op.
"""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from data_juicer_elastic.jobdir.manifest import load_manifest

from .conftest import driver_cmd, driver_env, run_driver
from .fakes import done_shards, merged_ids, prepare, write_input

BAD = "part-00001-of-00004"


def test_always_failing_shard_spends_its_budget_then_fails_the_job_with_exit_2(tmp_path):
    job = prepare(tmp_path)
    proc = run_driver("worker", job, "--retries", "2", "--fail", BAD)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert BAD in proc.stderr.strip().splitlines()[-1]
    failures = sorted(p.name for p in (job / "failures" / BAD).iterdir())
    assert failures == ["gen-000001.json", "gen-000002.json", "gen-000003.json"], "max_retries=2: three attempts"
    terminal = json.loads((job / "failed" / f"{BAD}.json").read_bytes())
    assert terminal["failures"] == 3 and "fake runner refuses" in terminal["last_error"]
    assert sorted(done_shards(job)) == [f"part-0000{i}-of-00004" for i in (0, 2, 3)]
    again = run_driver("worker", job, "--retries", "2")  # a later worker does not retry it again
    assert again.returncode == 2 and not (job / "claims" / BAD / "gen-000004.json").exists()
    status = subprocess.run(
        ["dj-elastic", "status", "--job-dir", str(job), "--json"], env=driver_env(), capture_output=True, text=True
    )
    assert status.returncode == 2 and json.loads(status.stdout)["counts"]["failed"] == 1


def _start_all(cmd_args, n, **env_kw):
    return [
        subprocess.Popen(
            driver_cmd(*cmd_args), env=driver_env(node=f"node-{i}", **env_kw),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(n)
    ]  # fmt: skip


def _results(procs):
    return [(p.returncode, out, err) for p in procs for out, err in [p.communicate(timeout=120)]]


def test_eight_concurrent_preparers_with_the_winner_killed_prepare_exactly_once(tmp_path):
    data = write_input(tmp_path / "in.jsonl", 40)
    job = tmp_path / "job"
    # Every process carries the crash point; only the one whose recipe link wins reaches it.
    results = _results(_start_all(["prepare", job, data], 8, crash="prepare"))
    codes = sorted(code for code, _, _ in results)
    assert codes == [-signal.SIGKILL] + [0] * 7, [err[-800:] for _, _, err in results]
    survivors = [json.loads(out.strip().splitlines()[-1]) for code, out, _ in results if code == 0]
    assert sum(s["created"] for s in survivors) == 1, "exactly one survivor published the plan"
    assert len({s["job_id"] for s in survivors}) == 1 == len({load_manifest(job).job_id} | {survivors[0]["job_id"]})
    assert run_driver("worker", job).returncode == 0
    assert run_driver("merge", job, tmp_path / "out.jsonl").returncode == 0
    assert merged_ids(tmp_path / "out.jsonl") == list(range(40))


@pytest.mark.slow
def test_elected_preparer_killed_then_a_resubmission_prepares_once_and_finalizes_twice(tmp_path):
    data = write_input(tmp_path / "in.jsonl", 40)
    job, out = tmp_path / "job", tmp_path / "out.jsonl"
    results = _results(_start_all(["run", job, data, out, "--run-id", "sub-1"], 8, crash="prepare"))
    codes = sorted(code for code, _, _ in results)
    assert codes == [-signal.SIGKILL] + [2] * 7, [err[-800:] for _, _, err in results]
    lines = {err.strip().splitlines()[-1] for code, _, err in results if code == 2}
    (line,) = lines  # every other instance stops at once with the same message
    assert "prepare coordinator" in line and "exited" in line, line
    assert not (job / "manifest.json").exists() and not out.exists()

    # The resubmission (new run id): one elected preparer reuses the published recipe; 2 instances.
    second = _results(_start_all(["run", job, data, out, "--run-id", "sub-2"], 2))
    assert [code for code, _, _ in second] == [0, 0], [err[-2000:] for _, _, err in second]
    prepared = [line for _, o, _ in second for line in o.splitlines() if line.startswith('{"prepared"')]
    assert prepared == ['{"prepared": true}'], "exactly one prepare in the resubmission"
    reports = [json.loads(o.strip().splitlines()[-1]) for _, o, _ in second]
    assert reports[0]["finalized_by"] == reports[1]["finalized_by"] and reports[0]["written"] is True
    assert merged_ids(out) == list(range(40))
    first_bytes = out.read_bytes()

    # Finalize killed mid-way, then a third submission: idempotent, same bytes, not rewritten.
    killed = _results(_start_all(["run", job, data, out, "--run-id", "sub-3"], 1, crash="finalize"))
    assert killed[0][0] == -signal.SIGKILL
    ((code, text, err),) = _results(_start_all(["run", job, data, out, "--run-id", "sub-4"], 1))
    assert code == 0, err[-2000:]
    assert json.loads(text.strip().splitlines()[-1])["written"] is False and out.read_bytes() == first_bytes
    assert len(done_shards(job)) == 4
