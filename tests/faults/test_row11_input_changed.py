"""Matrix row 11: input changed between prepare passes, since prepare, or during the run.

A hard error showing the old and the new sha256; no done marker for changed data.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from data_juicer_elastic.errors import InputChangedError
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job
from data_juicer_elastic.sharedfs import fault_seam

from .conftest import run_driver
from .fakes import prepare, write_input


def _request(job: Path, data: Path) -> PrepareRequest:
    return PrepareRequest(job, data, 4, recipe={"process": []}, stage_identities=[])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_input_edited_since_prepare_is_refused_with_old_and_new_sha(tmp_path):
    data = write_input(tmp_path / "in.jsonl", 40)
    job = tmp_path / "job"
    prepare_job(_request(job, data))
    old = _sha(data)
    data.write_text(data.read_text().replace("row 7 ", "row 7!"))
    with pytest.raises(InputChangedError) as info:
        prepare_job(_request(job, data))
    assert f"{old} -> {_sha(data)}" in info.value.message and info.value.where == str(data)


def test_input_edited_while_prepare_reads_it_is_refused(tmp_path):
    """The input changes under prepare (after its first look at the file): refused, nothing
    prepared. Independent of how many passes prepare makes: every later stat edits again."""
    data = write_input(tmp_path / "in.jsonl", 40)
    old = _sha(data)
    stats = []

    def edit_while_reading(op, path):
        if op == "stat" and Path(path) == data:
            stats.append(path)
            if len(stats) >= 2:
                data.write_text(data.read_text().replace("row 3 ", f"row 3{len(stats)}"))

    fault_seam.set_fault_hook(edit_while_reading)
    try:
        with pytest.raises(InputChangedError) as info:
            prepare_job(_request(tmp_path / "job", data))
    finally:
        fault_seam.set_fault_hook(None)
    assert info.value.where == str(data) and _sha(data) != old
    if "sha256" in info.value.message:  # the sha256 now is shown when prepare read the file whole
        assert _sha(data) in info.value.message
    assert not (tmp_path / "job" / "manifest.json").exists(), "not prepared"


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
