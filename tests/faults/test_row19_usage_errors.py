"""Fault matrix row 19: a full disk while merging or preparing, a job_dir that is a file, an
export path that is a directory, malformed input: one error line and exit 2, never a
traceback, and nothing half-written that looks valid.

Through ``dj-elastic`` and ``dj-process`` in subprocesses.
"""

from __future__ import annotations

import pytest

from .commands import dj_elastic, dj_process, error_line, faults, finished_job, recipe, small_input, tree


def test_a_full_disk_during_the_merge_is_one_line_and_leaves_no_output(tmp_path):
    job = finished_job(tmp_path)
    out = tmp_path / "out" / "merged.jsonl"
    full = faults({"op": "write", "path": ".merged.jsonl.tmp-", "errno": "ENOSPC"})
    line = error_line(dj_elastic("merge", "--job-dir", job, "--output", out, extra_env=full))
    assert "storage error" in line and "No space left on device" in line and ".merged.jsonl.tmp-" in line
    assert "free space" in line
    assert not out.exists() and list(out.parent.iterdir()) == [], "no output and no temp file may be left"


def test_a_full_disk_while_preparing_is_one_line_and_publishes_no_plan(tmp_path):
    data = small_input(tmp_path)
    job = tmp_path / "job"
    path = recipe(tmp_path, data, job, export=tmp_path / "out" / "merged.jsonl")
    full = faults({"op": "write", "path": "/.plan.json.tmp-", "errno": "ENOSPC"})  # the plan's own write
    line = error_line(dj_elastic("prepare", "--config", path, extra_env=full))
    assert "storage error" in line and "No space left on device" in line and str(job) in line
    assert not (job / "plan.json").exists() and not (job / "manifest.json").exists()
    proc = dj_elastic("prepare", "--config", path)  # with space again, the same job prepares
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("command", ["status", "worker", "merge", "retry", "verify", "report"])
def test_a_job_dir_that_is_a_file_is_one_line_for_every_command(tmp_path, command):
    job = tmp_path / "job"
    job.write_text("not a directory\n")
    extra = {
        "merge": ["--output", tmp_path / "out.jsonl"],
        "retry": ["--all-failed"],
        "report": ["--output", tmp_path / "report.html"],
    }.get(command, [])
    line = error_line(dj_elastic(command, "--job-dir", job, *extra))
    assert str(job) in line and "not a directory" in line
    assert job.read_text() == "not a directory\n"


@pytest.mark.extended  # every dj-elastic command: the test above, in the default run
def test_prepare_and_dj_process_refuse_a_job_dir_that_is_a_file(tmp_path):
    data = small_input(tmp_path)
    job = tmp_path / "job"
    job.write_text("not a directory\n")
    path = recipe(tmp_path, data, job, export=tmp_path / "out" / "merged.jsonl")
    for proc in (dj_elastic("prepare", "--config", path), dj_process(path)):
        line = error_line(proc)
        assert str(job) in line and "not a directory" in line
    assert job.read_text() == "not a directory\n"


def test_an_export_path_that_is_a_directory_is_refused_naming_it(tmp_path):
    job = finished_job(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    line = error_line(dj_elastic("merge", "--job-dir", job, "--output", out))
    assert "--output" in line and "is a directory" in line and str(out) in line
    data = small_input(tmp_path)
    line = error_line(dj_process(recipe(tmp_path, data, tmp_path / "job2", export=out)))
    assert "export_path" in line and "is a directory" in line
    assert tree(out) == {}


def test_a_malformed_row_is_worded_once(tmp_path):
    data = tmp_path / "input.jsonl"
    data.write_text('{"id": 0, "text": "fine"}\n{"id": 1, "text": "unterminated\n')
    path = recipe(tmp_path, data, tmp_path / "job", export=tmp_path / "out" / "merged.jsonl")
    line = error_line(dj_elastic("prepare", "--config", path, "--scan"))  # the rows are read by the scans
    assert f"{data}:2" in line and "Unterminated string starting at column" in line
    assert "at at" not in line
