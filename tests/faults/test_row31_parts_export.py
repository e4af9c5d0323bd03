"""Fault matrix row 31: publishing a parts export (``export_layout: parts``) killed at every step, out
of space, across filesystems, into a path that is not a place for it, and a tampered export, through
the worker driver and the real ``dj-elastic`` / ``dj-process`` commands.

The export path shows nothing or a complete export: parts are linked into a staging directory
beside it, the index is written last, and the directory is renamed into place.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from data_juicer_elastic.jobdir.exports import PARTS_INDEX

from .commands import dj_elastic, dj_process, error_line, faults, finished_job, recipe, small_input, tree
from .conftest import driver_cmd, driver_env, run_driver, summary_of
from .fakes import merged_ids, write_input

ROWS, SHARDS = 40, 4


def _parts_ids(export: Path) -> list[int]:
    index = json.loads((export / PARTS_INDEX).read_bytes())
    return [json.loads(line)["id"] for part in index["parts"] for line in (export / part["name"]).open()]


def _hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("point", ["merge@2", "finalize", "rename:/parts"])
def test_publication_killed_at_each_step_shows_nothing_and_publishing_again_completes(tmp_path, point):
    job = finished_job(tmp_path, ROWS, SHARDS)
    export = tmp_path / "out" / "parts"
    killed = run_driver("merge", job, export, "--layout", "parts", crash=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not export.exists(), "nothing at the export path before the whole export is there"
    assert len(_hidden(export.parent)) == 1, "the victim's staging directory (SIGKILL skips every cleanup)"
    first = run_driver("merge", job, export, "--layout", "parts")
    assert first.returncode == 0 and summary_of(first)["written"] is True, first.stderr[-2000:]
    assert _hidden(export.parent) == [], "the next publication on this host removed the dead one's staging"
    assert _parts_ids(export) == list(range(ROWS))
    again = run_driver("merge", job, export, "--layout", "parts")
    assert summary_of(again) == {**summary_of(first), "written": False}
    assert dj_elastic("verify", "--job-dir", job).returncode == 0


def test_killed_after_the_rename_the_export_is_complete_and_publishing_again_records_it(tmp_path):
    job = finished_job(tmp_path, ROWS, SHARDS)
    export = tmp_path / "parts"
    killed = run_driver("merge", job, export, "--layout", "parts", crash="replace:merge.json")
    assert killed.returncode == -signal.SIGKILL
    assert (export / PARTS_INDEX).is_file() and not (job / "merge.json").exists()
    again = run_driver("merge", job, export, "--layout", "parts")
    assert again.returncode == 0 and summary_of(again)["written"] is False
    assert (job / "merge.json").is_file() and _parts_ids(export) == list(range(ROWS))


def test_out_of_space_for_the_index_leaves_nothing_behind(tmp_path):
    job = finished_job(tmp_path, ROWS, SHARDS)
    export = tmp_path / "out" / "parts"
    rule = {"op": "write", "path": PARTS_INDEX, "errno": "ENOSPC"}
    line = error_line(
        dj_elastic("merge", "--job-dir", job, "--output", export, "--export-layout", "parts", extra_env=faults(rule))
    )
    assert "No space left on device" in line and "run the merge again" in line
    assert not export.exists() and _hidden(export.parent) == []


def test_across_filesystems_the_parts_are_copies_and_verify_passes(tmp_path):
    job = finished_job(tmp_path, ROWS, SHARDS)
    export = tmp_path / "parts"
    rule = {"op": "link", "path": ".parts.tmp-", "errno": "EXDEV", "times": None}
    proc = dj_elastic("merge", "--job-dir", job, "--output", export, "--export-layout", "parts", extra_env=faults(rule))
    assert proc.returncode == 0, proc.stderr[-2000:]
    part = export / "part-00000-of-00004.jsonl"
    assert part.stat().st_nlink == 1, "a copy, not a link"
    proc = dj_elastic("verify", "--job-dir", job)
    assert proc.returncode == 0 and "(parts: 40 rows" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_verify_names_a_tampered_part_and_merge_refuses_the_damaged_export(tmp_path):
    job = finished_job(tmp_path, ROWS, SHARDS)
    export = tmp_path / "parts"
    assert dj_elastic("merge", "--job-dir", job, "--output", export, "--export-layout", "parts").returncode == 0
    (export / "part-00001-of-00004.jsonl").unlink()
    line = error_line(dj_elastic("verify", "--job-dir", job))
    assert "part-00001-of-00004.jsonl is missing" in line and "--overwrite" in line
    line = error_line(dj_elastic("merge", "--job-dir", job, "--output", export, "--export-layout", "parts"))
    assert "part-00001-of-00004.jsonl is missing" in line and "overwrite" in line
    ok = dj_elastic("merge", "--job-dir", job, "--output", export, "--export-layout", "parts", "--overwrite")
    assert ok.returncode == 0 and _parts_ids(export) == list(range(ROWS))


@pytest.mark.parametrize("what", ["file", "foreign", "follow"])
def test_bad_combinations_are_one_error_and_exit_2(tmp_path, what):
    job = finished_job(tmp_path, ROWS, SHARDS)
    export = tmp_path / "out"
    export.mkdir()
    args = ["merge", "--job-dir", job, "--export-layout", "parts"]
    if what == "file":
        (export / "merged.jsonl").write_text("someone's\n")
        line = error_line(dj_elastic(*args, "--output", export / "merged.jsonl", "--overwrite"))
        assert "is a file; export_layout parts publishes a directory" in line
    elif what == "foreign":
        (export / "notes.txt").write_text("mine\n")
        line = error_line(dj_elastic(*args, "--output", export, "--overwrite"))
        assert "notes.txt" in line and "never removes files it did not write" in line
    else:
        line = error_line(dj_elastic(*args, "--output", export / "parts", "--follow"))
        assert "--follow" in line
    left = {"file": {"merged.jsonl": b"someone's\n"}, "foreign": {"notes.txt": b"mine\n"}, "follow": {}}
    assert tree(export) == left[what], "nothing written"


def test_the_file_layout_refuses_an_existing_directory_and_points_at_parts(tmp_path):
    job = finished_job(tmp_path, ROWS, SHARDS)
    (tmp_path / "dir").mkdir()
    line = error_line(dj_elastic("merge", "--job-dir", job, "--output", tmp_path / "dir", "--export-layout", "file"))
    assert "is a directory" in line and "export_layout: parts" in line


def test_dj_process_refuses_a_parts_export_over_a_file_before_writing_anything(tmp_path):
    data = small_input(tmp_path)
    job = tmp_path / "job"
    export = tmp_path / "out" / "merged"
    export.parent.mkdir()
    export.write_text("precious\n")
    line = error_line(dj_process(recipe(tmp_path, data, job, export=export, elastic={"export_layout": "parts"})))
    assert "export_path" in line and "is a file" in line
    assert not job.exists() and export.read_text() == "precious\n"


def test_merge_of_a_finished_parts_job_by_hand_is_byte_identical_to_the_file_layout(tmp_path):
    job = finished_job(tmp_path, ROWS, SHARDS)
    export, merged = tmp_path / "parts", tmp_path / "merged.jsonl"
    assert dj_elastic("merge", "--job-dir", job, "--output", export, "--export-layout", "parts").returncode == 0
    assert dj_elastic("merge", "--job-dir", job, "--output", merged).returncode == 0
    index = json.loads((export / PARTS_INDEX).read_bytes())
    assert b"".join((export / p["name"]).read_bytes() for p in index["parts"]) == merged.read_bytes()
    assert merged_ids(merged) == list(range(ROWS))


def test_instances_of_one_run_elect_one_finalizer_which_publishes_the_parts(tmp_path):
    """dj-process's own flow (elections, outcome, finalize) with the fake runner: three instances,
    one publication, every instance reports it; running the finished job again writes nothing."""
    data = write_input(tmp_path / "in.jsonl", ROWS)
    job, export = tmp_path / "job", tmp_path / "out" / "parts"

    def run(run_id: str, n: int) -> list[dict]:
        cmd = driver_cmd("run", job, data, export, "--run-id", run_id, "--layout", "parts")
        pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs = [subprocess.Popen(cmd, env=driver_env(node=f"node-{i}"), **pipes) for i in range(n)]
        outs = [(p.returncode, out, err) for p in procs for out, err in [p.communicate(timeout=120)]]
        assert [code for code, _, _ in outs] == [0] * n, [err[-2000:] for _, _, err in outs]
        return [json.loads(out.strip().splitlines()[-1]) for _, out, _ in outs]

    reports = run("sub-1", 3)
    assert len({r["finalized_by"] for r in reports}) == 1 and {r["layout"] for r in reports} == {"parts"}
    assert all(r["written"] for r in reports) and _parts_ids(export) == list(range(ROWS))  # the run's outcome
    assert not [p for p in export.parent.iterdir() if p.name.endswith((".partial", ".progress.json"))]
    (again,) = run("sub-2", 1)
    assert again["written"] is False
    assert dj_elastic("verify", "--job-dir", job).returncode == 0
