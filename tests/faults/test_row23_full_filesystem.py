"""Fault matrix row 23: ``dj-process`` with its job directory, or its export path, on a real full
filesystem (a tiny tmpfs in a mount namespace of its own, ``mounts``).

Whatever write hits the full disk first (a coordination record, a shard's output, a failure
record, the merged output, a log file), the run ends with one ``storage error`` line naming the
path and its place, exit 2, and no traceback: log files that cannot be written (this plugin's in
the job directory, Data-Juicer's in the export directory) are reported once and dropped
(``console.log_files``), never a "Logging error" per record.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from .commands import dj_process_argv, error_line, recipe
from .conftest import run_driver
from .fakes import write_input
from .mounts import fill, fill_when, mount_prefix, run_mounted, tmpfs

needs_mounts = pytest.mark.skipif(mount_prefix() is None, reason="no mount namespace may be created here (unshare)")


def _one_storage_error(proc, place: str, root: Path) -> str:
    last = error_line(proc)  # exit 2, no traceback on stderr, the error line last
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output and "Logging error" not in output, output[-4000:]
    assert last.startswith("dj-process: error: ") and "storage error" in last, last
    assert "No space left on device" in last and f"(the {place} {root}: free space" in last, last
    return last  # (Data-Juicer's set-up fails before the run: "Data-Juicer's work dir" there)


def _job(tmp: Path, mount: Path, where: str) -> tuple[Path, Path, Path]:
    data = tmp / "input.jsonl"  # two shards of ~45 KB
    data.write_text("".join(json.dumps({"id": i, "text": f"row {i} " + "x" * 200}) + "\n" for i in range(400)))
    job = mount / "job" if where == "job" else tmp / "job"
    export = (mount if where == "export" else tmp) / "out" / "merged.jsonl"
    return recipe(tmp, data, job, export=export), job, export


@pytest.mark.ray
@pytest.mark.e2e
@needs_mounts
@pytest.mark.parametrize("when", ["before-the-run", pytest.param("during-the-run", marks=pytest.mark.extended)])
def test_a_full_job_directory_is_one_storage_error(tmp_path, when):
    mount = tmp_path / "mnt"
    path, job, _ = _job(tmp_path, mount, "job")
    prepare = [sys.executable, "-m", "data_juicer_elastic.cli", "prepare", "--config", str(path)]
    steps = [tmpfs(mount, "400k"), shlex.join(prepare) + " >/dev/null 2>&1"]
    # during: full once the first attempt runs (its output, records and the logs then fail)
    steps.append(fill(mount) if when == "before-the-run" else fill_when(job / "attempts", mount))
    proc = run_mounted(steps, dj_process_argv(path))
    line = _one_storage_error(proc, "job directory", job)
    assert str(job) in line.split(": storage error")[0]


@pytest.mark.ray
@pytest.mark.e2e
@needs_mounts
@pytest.mark.extended  # the same guards as above, for the export folder
@pytest.mark.parametrize("free_kib", [0, 40], ids=["full-before-the-run", "full-during-the-run"])
def test_a_full_export_filesystem_is_one_storage_error(tmp_path, free_kib):
    mount = tmp_path / "mnt"
    path, _, export = _job(tmp_path, mount, "export")
    steps = [tmpfs(mount, "256k"), f"mkdir -p {shlex.quote(str(export.parent))}", fill(mount, free_kib)]
    proc = run_mounted(steps, dj_process_argv(path))
    _one_storage_error(proc, "export location", export.parent)
    assert "Data-Juicer's log file" not in proc.stderr, "its log files are in the job directory, not beside the export"


def test_a_failed_prepare_whose_outcome_record_fails_too_reports_the_prepare_error(tmp_path):
    """The elected preparer hits a full disk, and so does the run's failed outcome record: the
    instance reports the prepare's storage error (the others see its heartbeat stop)."""
    data = write_input(tmp_path / "input.jsonl", 40)
    full = [
        {"op": "write", "path": "/.plan.json.tmp-", "errno": "ENOSPC"},
        {"op": "create", "path": "outcome.json", "errno": "ENOSPC"},
    ]
    proc = run_driver("run", tmp_path / "job", data, tmp_path / "out.jsonl", "--run-id", "r1", faults=full)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "/.plan.json.tmp-" in last and "No space left on device" in last, last
    assert "could not record the end of run r1" in proc.stderr
