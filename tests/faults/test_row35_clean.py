"""Fault matrix row 35: ``dj-elastic clean`` (a verified job's shard outputs removed, its export kept)
killed at every step, refused on a job that is not finished or does not verify, and the commands that
need the outputs afterwards, through the real ``dj-elastic`` commands on jobs the fake runner finished.

The oracle is the input itself (the fake runner copies every row) and the bytes of the export before
the clean; what is freed is checked against the files the job directory held.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from data_juicer_elastic.jobdir.exports import PARTS_INDEX

from .commands import dj_elastic, error_line, finished_job, tree
from .fakes import merged_ids, prepare

ROWS, SHARDS = 40, 4
OUTPUTS = ("output.jsonl", "row-stats.jsonl", "errors.jsonl")


def _published(tmp: Path, *, layout: str = "file", copy_shards: bool = True) -> tuple[Path, Path]:
    job = finished_job(tmp, ROWS, SHARDS) if copy_shards else _finished_in_place(tmp)
    export = tmp / "out" / ("parts" if layout == "parts" else "merged.jsonl")
    proc = dj_elastic("merge", "--job-dir", job, "--output", export, "--export-layout", layout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return job, export


def _finished_in_place(tmp: Path) -> Path:
    from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
    from data_juicer_elastic.sharedfs.identity import WorkerIdentity

    from .fakes import LEASE, fsio_runner

    job = prepare(tmp, rows=ROWS, shards=SHARDS, copy_shards=False)
    settings = WorkerSettings(max_retries=0, wait_for_completion=False, **LEASE)
    run_worker(job, WorkerIdentity.current(), fsio_runner(), settings)
    return job


def _reclaimable(job: Path) -> dict[Path, int]:
    """The files clean removes, with their sizes: every attempt's outputs and the shard copies."""
    found = [p for p in (job / "attempts").rglob("*") if p.name in OUTPUTS]
    found += list((job / "shards").glob("*.jsonl*")) + list((job / "scans" / "attempts").rglob("shard.jsonl*"))
    return {p: p.stat().st_size for p in found}


def _ids(export: Path) -> list[int]:
    return [json.loads(line)["id"] for line in export.read_text().splitlines()]


def _tamper(path: Path) -> bytes:
    """Flip one byte of a row's value, keeping the size (what only a re-hash finds); the bytes before."""
    before = path.read_bytes()
    at = before.index(b'"id": 3') + len(b'"id": ') if b'"id": 3' in before else before.index(b"3")
    path.write_bytes(before[:at] + b"7" + before[at + 1 :])
    return before


def test_clean_frees_the_outputs_and_verify_still_judges_the_export(tmp_path):
    job, export = _published(tmp_path)
    before, files = export.read_bytes(), _reclaimable(job)
    assert len(files) == 3 * SHARDS, "an output per shard, its copy in shards/ and the scan's name for it"
    freed = sum(size for path, size in files.items() if "attempts" in path.parts and "scans" not in path.parts)
    freed += sum(size for path, size in files.items() if path.parent.name == "shards")  # the copy: one inode
    proc = dj_elastic("clean", "--job-dir", job)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"PASS: export {export} (file: {ROWS} rows" in proc.stdout
    assert f"removed {len(files)} file(s), freed {freed:,} bytes" in proc.stdout, proc.stdout
    assert not any(path.exists() for path in files), "every output and copy is gone"
    assert export.read_bytes() == before and _ids(export) == list(range(ROWS)), "the export is the input, untouched"
    record = json.loads((job / "clean.json").read_bytes())
    assert (record["complete"], record["files"], record["bytes_freed"]) == (True, len(files), freed)
    verify = dj_elastic("verify", "--job-dir", job)
    assert verify.returncode == 0 and f"PASS: export {export} (file: {ROWS} rows" in verify.stdout, verify.stderr
    _tamper(export)
    line = error_line(dj_elastic("verify", "--job-dir", job))
    assert "in the export do not match its accepted output" in line and "shard outputs were cleaned" in line
    export.write_bytes(before)
    again = dj_elastic("clean", "--job-dir", job)
    assert again.returncode == 0 and "(cleaned before)" in again.stdout and "removed 0 file(s)" in again.stdout


@pytest.mark.parametrize(
    "point",
    [
        pytest.param("replace:clean.json", marks=pytest.mark.extended),  # before its record
        "unlink:output.jsonl@2",  # after one output was removed
        pytest.param("replace:clean.json@2", marks=pytest.mark.extended),  # all removed, the record not complete
    ],
)
def test_a_clean_killed_anywhere_leaves_a_job_verify_judges_and_clean_again_finishes(tmp_path, point):
    job, export = _published(tmp_path)
    files = _reclaimable(job)
    killed = dj_elastic("clean", "--job-dir", job, extra_env={"DJ_ELASTIC_TEST_CRASH_AT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    removed = [path for path in files if not path.exists()]
    if point == "replace:clean.json":  # killed before its record: nothing removed, the job is as it was
        assert removed == [] and not (job / "clean.json").exists()
    else:
        assert removed and json.loads((job / "clean.json").read_bytes())["complete"] is False
    assert dj_elastic("verify", "--job-dir", job).returncode == 0, "a half-cleaned job verifies from its export"
    before = _tamper(export)
    assert "do not match" in error_line(dj_elastic("verify", "--job-dir", job)), "and a tampered export is found"
    assert "not match" in error_line(dj_elastic("clean", "--job-dir", job)), "nothing more removed from it"
    export.write_bytes(before)
    finished = dj_elastic("clean", "--job-dir", job)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert not any(path.exists() for path in files) and _ids(export) == list(range(ROWS))
    assert json.loads((job / "clean.json").read_bytes())["complete"] is True


def test_clean_refuses_a_job_that_is_not_finished_published_or_verified(tmp_path):
    unfinished = prepare(tmp_path / "a", rows=ROWS, shards=SHARDS)
    line = error_line(dj_elastic("clean", "--job-dir", unfinished))
    assert "not cleaned: job is not complete" in line
    unmerged = finished_job(tmp_path / "b", ROWS, SHARDS)
    line = error_line(dj_elastic("clean", "--job-dir", unmerged))
    assert "not cleaned: the job has no export yet" in line and "dj-elastic merge" in line
    job, export = _published(tmp_path / "c")
    _tamper(export)
    kept = tree(job)
    line = error_line(dj_elastic("clean", "--job-dir", job))
    assert line.startswith(f"error: {export}: not cleaned: the bytes of shard part-00000-of-00004"), line
    assert tree(job) == kept, "nothing removed, nothing written"


def test_after_clean_what_needs_the_outputs_refuses_and_the_rest_works(tmp_path):
    job, export = _published(tmp_path)
    assert dj_elastic("clean", "--job-dir", job).returncode == 0
    for args in (["retry", "--shard-id", "part-00001-of-00004"], ["merge", "--output", tmp_path / "other.jsonl"]):
        line = error_line(dj_elastic(args[0], "--job-dir", job, *args[1:]))
        assert "the shard outputs of this job were cleaned" in line and str(export) in line, line
    line = error_line(dj_elastic("merge", "--job-dir", job, "--output", export, "--follow", "--poll-secs", "0.1"))
    assert "were cleaned" in line and "merging needs them" in line
    again = dj_elastic("merge", "--job-dir", job, "--output", export)
    assert again.returncode == 0 and "already in" in again.stderr + again.stdout, again.stderr[-2000:]
    assert not (tmp_path / "other.jsonl").exists() and _ids(export) == list(range(ROWS))
    status = dj_elastic("status", "--job-dir", job, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["complete"] is True
    cleaned = json.loads(status.stdout)["cleaned"]
    assert (cleaned["export"], cleaned["complete"]) == (str(export), True) and cleaned["bytes_freed"] > 0
    text = dj_elastic("status", "--job-dir", job)
    assert text.returncode == 0 and f"the export {export} is the output" in text.stdout, text.stdout
    report = dj_elastic("report", "--job-dir", job, "--output", tmp_path / "report.html")
    assert report.returncode == 0, report.stderr[-2000:]


@pytest.mark.extended
def test_a_parts_export_keeps_its_parts_and_a_job_read_in_place_keeps_its_input(tmp_path):
    job, export = _published(tmp_path / "parts", layout="parts")
    index = json.loads((export / PARTS_INDEX).read_bytes())
    copies = sum(path.stat().st_size for path in (job / "shards").iterdir())
    proc = dj_elastic("clean", "--job-dir", job)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"freed {copies:,} bytes" in proc.stdout, "the shard copies only: each accepted output is a part (one inode)"
    assert [i for p in index["parts"] for i in merged_ids(export / p["name"])] == list(range(ROWS))
    assert all((export / p["name"]).stat().st_nlink == 1 for p in index["parts"]), "the parts are the only names now"
    assert dj_elastic("verify", "--job-dir", job).returncode == 0
    _tamper(export / "part-00000-of-00004.jsonl")
    assert "does not match the index" in error_line(dj_elastic("verify", "--job-dir", job))
    job, export = _published(tmp_path / "in-place", copy_shards=False)
    data = job.parent / "job-input.jsonl"
    before = data.read_bytes()
    assert dj_elastic("clean", "--job-dir", job).returncode == 0
    assert data.read_bytes() == before, "the input is never touched"
    assert dj_elastic("verify", "--job-dir", job).returncode == 0


def test_clean_removes_a_deduplicated_jobs_signature_and_edge_files_and_a_rerun_needs_none(tmp_path):
    """Deduplication's intermediates (the fault driver's exact-dedup fakes, two stages): clean removes the
    signature and edge files and what a refusal set aside; the markers, drop lists and plans stay; verify
    still passes, and a rerun of the cleaned job (its input read in place) runs no phase again."""
    from .conftest import run_driver, summary_of
    from .fakes import DEDUP_PROCESS

    job = prepare(tmp_path, rows=ROWS, shards=SHARDS, process=DEDUP_PROCESS, copy_shards=False)
    proc = run_driver("worker", job, "--dedup")
    assert proc.returncode == 0, proc.stderr[-3000:]
    aside = job / "dedup" / "1" / "edges" / ".part-00000-of-00004.edges.refused-a1"
    aside.write_bytes(b"set aside")
    export = tmp_path / "out" / "merged.jsonl"
    merge = dj_elastic("merge", "--job-dir", job, "--output", export)
    assert merge.returncode == 0, merge.stderr[-2000:]
    before = export.read_bytes()
    intermediates = [p for p in (job / "dedup").rglob("*") if p.suffix in (".sig", ".edges")] + [aside]
    kept = {p: p.read_bytes() for p in (job / "dedup").rglob("*") if p.suffix == ".drops" or p.suffix == ".json"}
    assert len(intermediates) == 2 * (SHARDS + SHARDS) + 1 and kept
    clean = dj_elastic("clean", "--job-dir", job)
    assert clean.returncode == 0, clean.stderr[-2000:]
    assert not any(path.exists() for path in intermediates), "every signature and edge file is gone"
    assert {p: p.read_bytes() for p in kept} == kept, "markers, drop lists, plans and records stay as they were"
    verify = dj_elastic("verify", "--job-dir", job)
    assert verify.returncode == 0 and f"PASS: export {export}" in verify.stdout, verify.stderr[-2000:]
    again = run_driver("worker", job, "--dedup", node="again")
    assert again.returncode == 0 and summary_of(again)["claimed"] == 0, again.stderr[-3000:]
    assert not any(path.exists() for path in intermediates) and export.read_bytes() == before
    status = json.loads(dj_elastic("status", "--job-dir", job, "--json").stdout)["dedup"]
    assert [s["phase"] for s in status] == ["done", "done"]
