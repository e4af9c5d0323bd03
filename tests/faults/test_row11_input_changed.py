"""Matrix row 11: input changed since the plan, between the plan and a scan, or during the run.

A hard error naming the file and what changed (size and mtime, or the content's old and new
sha256); no done marker for changed data, whether shards are read in place or copied.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from data_juicer_elastic.errors import InputChangedError
from data_juicer_elastic.shards.prepare import PrepareRequest, plan_job, prepare_job
from data_juicer_elastic.sharedfs import fault_seam

from .conftest import run_driver
from .fakes import prepare, write_input


def _request(job: Path, data: Path) -> PrepareRequest:
    return PrepareRequest(job, data, 4, recipe={"process": []}, stage_identities=[])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_input_edited_since_prepare_is_refused_naming_what_changed(tmp_path):
    data = write_input(tmp_path / "in.jsonl", 40)
    job = tmp_path / "job"
    before = data.stat()
    prepare_job(_request(job, data))
    data.write_text(data.read_text().replace("row 7 ", "row 7!!"))
    with pytest.raises(InputChangedError) as info:
        prepare_job(_request(job, data))
    after = data.stat()
    assert info.value.where == str(data)
    assert f"size {before.st_size} -> {after.st_size}" in info.value.message
    assert f"mtime_ns {before.st_mtime_ns} -> {after.st_mtime_ns}" in info.value.message


def test_input_edited_between_the_plan_and_its_scan_refuses_the_job(tmp_path):
    data = write_input(tmp_path / "in.jsonl", 40)
    job = tmp_path / "job"
    plan_job(_request(job, data))
    data.write_text(data.read_text().replace("row 7 ", "row 7!"))  # one byte more: the plan's cuts moved
    proc = run_driver("worker", job)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert str(data) in line and "input changed since the job was planned" in line
    assert not (job / "manifest.json").exists() and not list((job / "done").iterdir()), "nothing ran"


def test_input_edited_while_a_scan_reads_it_is_refused(tmp_path):
    """The input changes while its scan reads it (after the scan's first look at the file):
    refused, nothing prepared."""
    data = write_input(tmp_path / "in.jsonl", 40)
    plan_job(_request(tmp_path / "job", data))
    stats = []

    def edit_while_reading(op, path):
        if op == "stat" and Path(path) == data:
            stats.append(path)
            if len(stats) == 3:  # plan check, the first scan's look before its read, then after it
                data.write_text(data.read_text().replace("row 3 ", "row 3!"))

    fault_seam.set_fault_hook(edit_while_reading)
    try:
        with pytest.raises(InputChangedError) as info:
            prepare_job(_request(tmp_path / "job", data))
    finally:
        fault_seam.set_fault_hook(None)
    assert info.value.where == str(data) and "while it was read" in info.value.message
    assert not (tmp_path / "job" / "manifest.json").exists(), "not prepared"


def test_input_edited_during_the_run_is_never_run_when_shards_are_read_in_place(tmp_path):
    """Zero-copy shards: an input changed after its scan fails every attempt of every shard not yet
    run that reads that file (its size or mtime no longer match the plan), naming the file; the
    shards already done keep their results; nothing changed is published."""
    job = prepare(tmp_path, copy_shards=False)
    data = tmp_path / "job-input.jsonl"
    assert run_driver("worker", job, "--max-shards", "2").returncode == 0  # two shards done before the edit
    data.write_text(data.read_text().replace("row 39", "row 3Z"))  # in the last shard; same size
    proc = run_driver("worker", job, "--retries", "1")
    assert proc.returncode == 2, proc.stderr[-3000:]
    done = sorted(p.name for p in (job / "done").iterdir())
    assert done == ["part-00000-of-00004.json", "part-00001-of-00004.json"], "only the shards done before"
    for shard in ("part-00002-of-00004", "part-00003-of-00004"):
        failed = json.loads((job / "failed" / f"{shard}.json").read_bytes())
        assert failed["last_error"].startswith(f"{data}: input changed since the job was planned and scanned")


def test_input_edited_with_its_mtime_restored_is_caught_by_the_content_hash(tmp_path):
    job = prepare(tmp_path, copy_shards=False)
    data = tmp_path / "job-input.jsonl"
    before = data.stat()
    data.write_text(data.read_text().replace("row 5", "row Z"))  # same size, in the first shard
    import os

    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))  # the metadata as planned
    proc = run_driver("worker", job, "--retries", "0")
    assert proc.returncode == 2, proc.stderr[-3000:]
    failed = json.loads((job / "failed" / "part-00000-of-00004.json").read_bytes())
    assert "sha256" in failed["last_error"] and str(data) in failed["last_error"]
    assert not (job / "done" / "part-00000-of-00004.json").exists()


def test_shard_edited_during_the_run_fails_its_attempts_and_never_publishes(tmp_path):
    job = prepare(tmp_path)
    shard = job / "shards" / "part-00002-of-00004.jsonl"
    expected = json.loads((job / "manifest.json").read_bytes())["shards"][2]["sha256"]
    shard.write_bytes(shard.read_bytes().replace(b"row 2", b"row Z", 1))
    proc = run_driver("worker", job, "--retries", "1")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert not (job / "done" / "part-00002-of-00004.json").exists()
    failure = json.loads((job / "failures" / "part-00002-of-00004" / "gen-000001.json").read_bytes())
    assert failure["error_type"] == "IntegrityError"
    assert f"sha256={expected}" in failure["error"] and f"sha256={_sha(shard)}" in failure["error"]
    assert "part-00002-of-00004" in proc.stderr.strip().splitlines()[-1]
    assert len(list((job / "done").iterdir())) == 3, "the other shards are unaffected"
