"""Fault matrix row 27: a read-only filesystem under the export path or the job directory.

A storage error names the path that failed and the place it is in (the export location, the
job directory), so the hint points at the filesystem that refused: ``dj-elastic merge
--output`` onto a read-only mount is not a job-directory problem.  Real read-only bind mounts
(``mounts``); where this machine permits no mount namespace, the same errno injected.
"""

from __future__ import annotations

import sys

import pytest

from .commands import dj_elastic, error_line, faults, finished_job
from .mounts import mount_prefix, read_only, run_mounted


def _merge(job, out, read_only_dir, real: bool):
    if real:
        argv = [sys.executable, "-m", "data_juicer_elastic.cli", "merge", "--job-dir", str(job), "--output", str(out)]
        return run_mounted([read_only(read_only_dir)], argv)
    where = "/.merged.jsonl.tmp-" if read_only_dir == out.parent else "/.merge.json.tmp-"
    return dj_elastic("merge", "--job-dir", job, "--output", out, extra_env=faults(
        {"op": "create", "path": where, "errno": "EROFS"}
    ))  # fmt: skip


@pytest.mark.parametrize("real", [True, False], ids=["mount", "injected"])
@pytest.mark.parametrize("place", ["export location", "job directory"])
def test_a_read_only_place_is_named_with_its_role(tmp_path, place, real):
    if real and mount_prefix() is None:
        pytest.skip("no mount namespace may be created here (unshare --mount / --user)")
    job = finished_job(tmp_path)
    out = tmp_path / "out" / "merged.jsonl"
    out.parent.mkdir()
    refusing = out.parent if place == "export location" else job
    line = error_line(_merge(job, out, refusing, real))
    assert "storage error: Read-only file system" in line, line
    assert f"(the {place} {refusing}: check that this user may read and write there" in line, line
    other = {"export location": "job directory", "job directory": "export location"}[place]
    assert other not in line, line
    assert "run the merge again" in line
