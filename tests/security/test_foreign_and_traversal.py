"""Foreign or newer-format job directories are refused clearly (exit 2, one line), and no
identifier (shard id, attempt id, node id, a path in a record) can leave the job directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_juicer_elastic.errors import IntegrityError, JobDirError
from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.layout import JobLayout, open_job_dir
from data_juicer_elastic.jobdir.records import ShardResult
from data_juicer_elastic.jobdir.retry import retry_shards
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.sharedfs.identity import safe_name
from tests.jobdir.conftest import copy_runner, identity, make_rows, request, write_rows

SHARD = "part-00000-of-00004"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", *args], capture_output=True, text=True, timeout=120
    )


def _rewrite_manifest(job: Path, **changes) -> None:
    path = job / "manifest.json"
    obj = json.loads(path.read_bytes())
    obj.update(changes)
    path.unlink()  # the manifest is a hard link of a staged file: replace, never edit in place
    path.write_text(json.dumps(obj))


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"version": 2}, "manifest record has version 2; this dj-elastic reads version 1"),
        ({"format": "other-tool/manifest"}, "not a dj-elastic manifest record"),
    ],
    ids=["newer-format", "foreign-manifest"],
)
def test_cli_refuses_a_newer_or_foreign_job_dir_with_one_line_and_exit_2(job, tmp_path, changes, expected):
    _rewrite_manifest(job, **changes)
    before = sorted(p.relative_to(job) for p in job.rglob("*"))
    # (merge and worker load the same manifest through the same code, but import Data-Juicer: slow)
    for args in (["status", "--job-dir", str(job)], ["retry", "--job-dir", str(job), "--all-failed"]):
        proc = _cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and expected in lines[0] and str(job) in lines[0], (args, proc.stderr)
        assert lines[0].startswith("error: ") and "Traceback" not in proc.stderr
    assert sorted(p.relative_to(job) for p in job.rglob("*")) == before, "nothing written"


def test_worker_refuses_a_newer_job_dir_before_claiming(job):
    _rewrite_manifest(job, version=2)
    with pytest.raises(JobDirError, match="version 2"):
        run_worker(
            job,
            identity(),
            copy_runner(),
            WorkerSettings(
                ttl_secs=60, heartbeat_secs=10, max_retries=0, poll_interval_secs=1, wait_for_completion=False
            ),
        )
    assert not list((job / "claims").iterdir())


def test_prepare_refuses_a_directory_that_is_not_a_job(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(8))
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("precious")
    with pytest.raises(JobDirError, match="not a dj-elastic job directory") as info:
        prepare_job(request(home, data, 2))
    assert "thesis.tex" in info.value.message and info.value.where == str(home)
    assert os.listdir(home) == ["thesis.tex"], "nothing written into a foreign directory"


def test_prepare_accepts_an_empty_dir_and_a_crashed_prepare_and_coordination_leftovers(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(8))
    job = tmp_path / "job"
    (job / "coordination" / "0123456789abcdef").mkdir(parents=True)  # an election ran first
    (job / "logs").mkdir()
    (job / ".staging-1-2-3").mkdir()  # a preparer crashed
    (job / ".nfs0000000000001234").write_text("")
    assert prepare_job(request(job, data, 2)).created


def test_a_run_refuses_a_foreign_job_dir_before_its_first_write(tmp_path):
    """What dj-process (job_run.JobRun.run) calls before elections write coordination records."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("precious")
    with pytest.raises(JobDirError, match="not a dj-elastic job directory"):
        open_job_dir(JobLayout(home))
    assert os.listdir(home) == ["notes.txt"]


def test_open_job_dir_checks_a_prepared_job_for_links(job, tmp_path):
    open_job_dir(JobLayout(job))  # a prepared job passes
    (tmp_path / "elsewhere").mkdir()
    os.rename(job / "done", tmp_path / "done-moved")
    (job / "done").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(JobDirError, match="outside the job directory"):
        open_job_dir(JobLayout(job))


@pytest.mark.parametrize("bad", ["../../etc", "part-00000-of-00004/../../x", "/etc/passwd", "part-1-of-4", ""])
def test_retry_refuses_traversing_shard_ids(job, bad):
    with pytest.raises(JobDirError, match="invalid shard id"):
        retry_shards(job, [bad])


def test_cli_retry_refuses_a_traversing_shard_id_with_exit_2(job):
    proc = _cli("retry", "--job-dir", str(job), "--shard-id", "../../etc")
    assert proc.returncode == 2 and "invalid shard id" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("bad", ["..", "../x", "a/b", "/abs", ".hidden", "a\x00b", "x" * 200])
def test_layout_refuses_traversing_attempt_and_instance_ids(job, bad):
    layout = JobLayout(job)
    for make in (lambda: layout.attempt_dir(SHARD, bad), lambda: layout.participant("0" * 24, bad)):
        with pytest.raises(JobDirError):
            make()


@pytest.mark.parametrize("node", ["../../x", "..", "/etc", "a/../../b", "\x00"])
def test_node_ids_become_one_safe_component(job, node):
    path = JobLayout(job).node_log_dir(node)
    assert path.parent == job / "logs" and path.name not in ("", ".", "..") and "/" not in safe_name(node)


@pytest.mark.parametrize("output", ["../../../outside.jsonl", "/etc/hostname", "attempts/../../x", ""])
def test_a_done_marker_pointing_out_of_the_job_dir_fails_the_merge_naming_the_shard(job, tmp_path, output):
    run_worker(
        job,
        identity(),
        copy_runner(),
        WorkerSettings(ttl_secs=60, heartbeat_secs=10, max_retries=0, poll_interval_secs=1, wait_for_completion=False),
    )
    layout = JobLayout(job)
    result, _ = attempts.read_done(layout, SHARD)
    forged = layout.done(SHARD)
    forged.unlink()
    forged.write_bytes(ShardResult(**{**result.__dict__, "output": output}).encode())
    with pytest.raises(IntegrityError) as info:
        merge_job(job, tmp_path / "out.jsonl")
    assert info.value.where == f"shard {SHARD}" and "not inside the job directory" in info.value.message
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.e2e
def test_dj_process_refuses_a_foreign_job_dir_with_exit_2(tmp_path):
    """Through the command a user runs: nothing is written into a directory that is not a job."""
    from tests.e2e.conftest import elastic_recipe, run

    data = write_rows(tmp_path / "in.jsonl", make_rows(8))
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("precious")
    recipe = elastic_recipe(tmp_path, data, job_dir=str(home), num_shards=2)
    proc = run(["dj-process", "--config", str(recipe)], cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "not a dj-elastic job directory (it holds notes.txt)" in proc.stderr and "Traceback" not in proc.stderr
    assert os.listdir(home) == ["notes.txt"]


def test_a_done_marker_naming_another_attempts_output_fails_the_merge(job, tmp_path):
    """A marker must name an output inside its own shard's attempt directory: otherwise one
    shard's accepted rows could be merged twice (as long as the record's numbers match them)."""
    run_worker(
        job,
        identity(),
        copy_runner(),
        WorkerSettings(ttl_secs=60, heartbeat_secs=10, max_retries=0, poll_interval_secs=1, wait_for_completion=False),
    )
    layout = JobLayout(job)
    first, _ = attempts.read_done(layout, SHARD)
    other = "part-00001-of-00004"
    second, _ = attempts.read_done(layout, other)
    forged = ShardResult(**{**first.__dict__, "shard_id": other, "attempt_id": second.attempt_id,
                            "input_rows": second.input_rows, "input_sha256": second.input_sha256})  # fmt: skip
    layout.done(other).unlink()
    layout.done(other).write_bytes(forged.encode())
    with pytest.raises(IntegrityError) as info:
        merge_job(job, tmp_path / "out.jsonl")
    assert info.value.where == f"shard {other}" and "attempt directory" in info.value.message
    assert not (tmp_path / "out.jsonl").exists()
