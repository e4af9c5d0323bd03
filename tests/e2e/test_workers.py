"""Several `dj-elastic worker` processes on one job, a worker killed mid-shard, a shard that
always fails: through the real commands, with real Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import DEMO_PROCESS, OPS_DIR, assert_ok, elastic_recipe, run

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

NUM_SHARDS = 6


def _slow_process(seconds_per_row: float) -> list:
    return [{"e2e_sleep_mapper": {"seconds_per_row": seconds_per_row}}, *DEMO_PROCESS]


def _prepare(tmp: Path, data: Path, name: str, **elastic) -> Path:
    recipe = elastic_recipe(
        tmp,
        data,
        name=name,
        num_shards=NUM_SHARDS,
        process=_slow_process(elastic.pop("seconds_per_row", 0.02)),
        **elastic,
    )
    text = recipe.read_text() + f"custom_operator_paths: ['{OPS_DIR / 'e2e_ops.py'}']\n"
    recipe.write_text(text)
    assert_ok(run(["dj-elastic", "prepare", "--config", str(recipe)], cwd=tmp))
    return tmp / name / "job"


def _start_worker(job: Path, node: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "DJ_ELASTIC_NODE_ID": node}
    return subprocess.Popen(
        ["dj-elastic", "worker", "--job-dir", str(job), *extra],
        env=env,
        cwd=job.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def _done_records(job: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((job / "done").iterdir())}


def _merge(job: Path, output: Path) -> bytes:
    assert_ok(run(["dj-elastic", "merge", "--job-dir", str(job), "--output", str(output)], cwd=job.parent))
    return output.read_bytes()


@pytest.fixture(scope="module")
def one_worker_output(tmp_path_factory, demo_input) -> bytes:
    tmp = tmp_path_factory.mktemp("one")
    job = _prepare(tmp, demo_input, "one", seconds_per_row=0.0)
    _finish(_start_worker(job, "solo"))
    return _merge(job, tmp / "merged.jsonl")


@pytest.mark.extended
def test_two_workers_share_the_job_and_match_one_worker(tmp_path, demo_input, one_worker_output):
    job = _prepare(tmp_path, demo_input, "two")
    # A claim cap of half the shards each guarantees that both nodes do work.
    workers = [_start_worker(job, node, "--max-shards", str(NUM_SHARDS // 2)) for node in ("node-a", "node-b")]
    for worker in workers:
        _finish(worker)
    done = _done_records(job)
    assert len(done) == NUM_SHARDS
    assert _merge(job, tmp_path / "merged.jsonl") == one_worker_output
    proc = run(["dj-elastic", "verify", "--job-dir", str(job), "--expect-nodes", "2"], cwd=tmp_path)
    assert_ok(proc)
    proc = run(["dj-elastic", "verify", "--job-dir", str(job), "--expect-nodes", "3"], cwd=tmp_path)
    assert proc.returncode == 2 and "node" in proc.stderr


@pytest.mark.extended
def test_three_concurrent_workers_process_every_shard_exactly_once(tmp_path, demo_input, one_worker_output):
    job = _prepare(tmp_path, demo_input, "three")
    workers = [_start_worker(job, f"node-{i}") for i in range(3)]
    for worker in workers:
        _finish(worker)
    assert len(_done_records(job)) == NUM_SHARDS
    for shard_dir in (job / "attempts").iterdir():
        assert len(list(shard_dir.iterdir())) == 1, f"{shard_dir.name} was attempted more than once"
    assert _merge(job, tmp_path / "merged.jsonl") == one_worker_output


@pytest.mark.extended
def test_worker_killed_mid_shard_is_taken_over(tmp_path, demo_input, one_worker_output):
    job = _prepare(tmp_path, demo_input, "kill", seconds_per_row=0.05, lease_ttl_secs=8)
    victim = _start_worker(job, "victim")
    deadline = time.monotonic() + 120
    while not list((job / "attempts").glob("*/*/process.log")):
        assert time.monotonic() < deadline, "the victim never started a shard"
        assert victim.poll() is None, victim.stdout.read()
        time.sleep(0.2)
    time.sleep(1.0)  # well inside the shard: 100 rows x 50 ms
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert len(list((job / "done").iterdir())) < NUM_SHARDS

    _finish(_start_worker(job, "rescuer"))
    done = _done_records(job)
    assert len(done) == NUM_SHARDS
    assert _merge(job, tmp_path / "merged.jsonl") == one_worker_output
    claimed_twice = [d for d in (job / "claims").iterdir() if len(list(d.iterdir())) > 1]
    assert claimed_twice, "the killed worker's shard must have been taken over under a new generation"


@pytest.mark.extended
def test_always_failing_shard_ends_in_exit_2_and_can_be_retried(tmp_path, demo_input):
    process = [{"e2e_fail_mapper": {"fail_id": 5}}, *DEMO_PROCESS]
    recipe = elastic_recipe(tmp_path, demo_input, name="fail", num_shards=3, max_retries=1, process=process)
    recipe.write_text(
        recipe.read_text() + f"custom_operator_paths: ['{OPS_DIR / 'e2e_ops.py'}']\nskip_op_error: false\n"
    )
    proc = run(["dj-process", "--config", str(recipe)], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "part-00000-of-00003" in proc.stderr
    assert "Traceback" not in proc.stderr.splitlines()[-1]
    assert not (tmp_path / "fail" / "merged.jsonl").exists()

    job = tmp_path / "fail" / "job"
    failures = list((job / "failures" / "part-00000-of-00003").iterdir())
    assert len(failures) == 2, "max_retries=1 allows exactly two attempts"
    status = run(["dj-elastic", "status", "--job-dir", str(job), "--json"], cwd=tmp_path)
    assert status.returncode == 2
    assert json.loads(status.stdout)["counts"]["failed"] == 1

    assert_ok(run(["dj-elastic", "retry", "--job-dir", str(job), "--all-failed"], cwd=tmp_path))
    status = run(["dj-elastic", "status", "--job-dir", str(job)], cwd=tmp_path)
    assert status.returncode == 1, status.stdout + status.stderr
    assert list((job / "history").rglob("*.json")), "retry archives the old failure records"


BAD_INPUTS = {
    "blank_line": (b'{"id": 0, "text": "hello world here"}\n\n{"id": 1, "text": "x"}\n', ":2"),
    "array_row": (b'{"id": 0, "text": "hello world here"}\n[1, 2]\n', ":2"),
    "malformed_json": (b'{"id": 0, "text": "hello world here"}\n{"id": 1, "text": \n', ":2"),
    "invalid_utf8": (b'{"id": 0, "text": "hello world here"}\n{"id": 1, "text": "\xff\xfe"}\n', ":2"),
}


# One case in the default run (the row checkers are tested without dj-process in tests/jobdir);
# every case through the real dj-process in the extended run.
@pytest.mark.parametrize(
    "case",
    [pytest.param(case, marks=() if case == "malformed_json" else pytest.mark.extended) for case in sorted(BAD_INPUTS)],
)
def test_bad_input_exits_2_naming_file_and_line(tmp_path, case):
    content, where = BAD_INPUTS[case]
    data = tmp_path / "bad.jsonl"
    data.write_bytes(content)
    recipe = elastic_recipe(tmp_path, data, num_shards=1)
    proc = run(["dj-process", "--config", str(recipe)], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"bad.jsonl{where}" in proc.stderr
    assert not (tmp_path / "job" / "merged.jsonl").exists()


REFUSED = {
    "deduplicator": ([{"image_deduplicator": None}], "process[0] image_deduplicator"),
    "selector": ([{"topk_specified_field_selector": {"field_key": "id", "topk": 3}}], "topk_specified_field_selector"),
    "stats_export_path": (DEMO_PROCESS, "stats_export_path"),
    "too_many_shards": (DEMO_PROCESS, "num_shards"),
}


@pytest.mark.extended
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_recipe_exits_2_naming_the_problem(tmp_path, demo_input, case):
    process, expected = REFUSED[case]
    recipe = elastic_recipe(
        tmp_path, demo_input, process=process, num_shards=10_000 if case == "too_many_shards" else 2
    )
    if case == "stats_export_path":
        recipe.write_text(recipe.read_text() + f"stats_export_path: {tmp_path / 'stats.jsonl'}\n")
    proc = run(["dj-process", "--config", str(recipe)], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert expected in proc.stderr
    assert not (tmp_path / "job" / "merged.jsonl").exists()
