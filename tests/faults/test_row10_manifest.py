"""Matrix row 10: a corrupt manifest (truncated, bad JSON, wrong sha, missing shard).

Every worker refuses before claiming anything, with one clear error naming the manifest
(or the shards folder) and exit code 2.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.sharedfs import fault_seam

from .conftest import driver_cmd, driver_env
from .fakes import prepare


def _truncate(job):
    data = (job / "manifest.json").read_bytes()
    (job / "manifest.json").write_bytes(data[: len(data) // 3])


def _bad_json(job):
    data = (job / "manifest.json").read_bytes()
    (job / "manifest.json").write_bytes(data.replace(b":", b";", 1))


def _wrong_sha(job):
    """A well-formed but wrong shard sha256 (one hex digit changed): parses, passes validation."""
    obj = json.loads((job / "manifest.json").read_bytes())
    sha = obj["shards"][2]["sha256"]
    obj["shards"][2]["sha256"] = ("0" if sha[0] != "0" else "1") + sha[1:]
    (job / "manifest.json").write_text(json.dumps(obj, indent=1))


def _missing_entry(job):
    obj = json.loads((job / "manifest.json").read_bytes())
    del obj["shards"][1]
    (job / "manifest.json").write_text(json.dumps(obj, indent=1))


def _missing_file(job):
    (job / "shards" / "part-00003-of-00004.jsonl").unlink()


CASES = {
    "truncated": (_truncate, "manifest.json", "corrupt manifest"),
    "bad_json": (_bad_json, "manifest.json", "corrupt manifest"),
    "wrong_sha": (_wrong_sha, "manifest.json", "checksum mismatch"),
    "missing_shard_entry": (_missing_entry, "manifest.json", "4 but 3 shards"),
    "missing_shard_file": (_missing_file, "shards", "part-00003-of-00004"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_worker_refuses_a_corrupt_manifest_before_claiming(tmp_path, case):
    job = prepare(tmp_path)
    damage, where, message = CASES[case]
    damage(job)
    workers = [
        subprocess.Popen(
            driver_cmd("worker", job), env=driver_env(node=f"w{i}"), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )
        for i in range(3)
    ]  # fmt: skip
    lines = set()
    for proc in workers:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err[-3000:]
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
        lines.add(errors[0])
    (line,) = lines  # one and the same error from every worker
    assert message in line and f"{job}/{where}" in line, line
    assert not list((job / "claims").rglob("gen-*")), "nothing was claimed"


# -- manifest-rows.json: what `dj-elastic status` reads instead of decoding the manifest ----------------------
def _status(job) -> tuple[int, dict, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--job-dir", str(job), "--json"],
        capture_output=True, text=True, timeout=120, env=driver_env(),
    )  # fmt: skip
    data = json.loads(proc.stdout) if proc.returncode != 2 else {}
    return (
        proc.returncode,
        {key: data.get(key) for key in ("job_id", "counts", "rows_total", "scan", "shards")},
        proc.stderr,
    )


def _rewrite_record(job, change) -> None:
    """The record with ``change`` applied and its checksum made to match again."""
    obj = json.loads((job / "manifest-rows.json").read_bytes())
    change(obj)
    body = {key: value for key, value in obj.items() if key != "checksum"}
    obj["checksum"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (job / "manifest-rows.json").write_text(json.dumps(obj))


RECORD_CASES = {
    "missing": lambda job: (job / "manifest-rows.json").unlink(),
    "torn": lambda job: (job / "manifest-rows.json").write_bytes((job / "manifest-rows.json").read_bytes()[:100]),
    "a byte flipped": lambda job: (job / "manifest-rows.json").write_bytes(
        (job / "manifest-rows.json").read_bytes().replace(b'"rows":[', b'"rows":[9', 1)
    ),
    "made from another manifest": lambda job: _rewrite_record(
        job, lambda obj: obj.update(manifest_sha256="0" * 64, rows=[9] * len(obj["rows"]))
    ),
    "another job": lambda job: _rewrite_record(
        job, lambda obj: obj.update(job_id="other", rows=[9] * len(obj["rows"]))
    ),
    "a directory": lambda job: ((job / "manifest-rows.json").unlink(), (job / "manifest-rows.json").mkdir()),
}


@pytest.mark.parametrize("case", sorted(RECORD_CASES))
def test_status_reads_the_manifest_itself_when_its_rows_record_cannot_be_trusted(tmp_path, case):
    """Prepare writes manifest-rows.json beside the manifest; status reads it (no decoding of the
    manifest) and shows the same job as from the manifest itself.  A record missing, torn, damaged,
    made from other manifest bytes or naming another job is not trusted: status decodes the manifest."""
    job = prepare(tmp_path)
    assert (job / "manifest-rows.json").is_file(), "the publisher writes the record with the manifest"
    seen: list[str] = []
    fault_seam.set_fault_hook(lambda op, path: seen.append(str(path)))
    try:
        light = load_manifest(job, entries=False)
    finally:
        fault_seam.set_fault_hook(None)
    assert f"{job}/manifest-rows.json" in seen
    full = load_manifest(job)  # the validated entries: the oracle
    assert [(e.shard_id, e.rows, e.span_bytes) for e in light.shards] == [
        (e.shard_id, e.rows, e.span_bytes) for e in full.shards
    ] and replace(light, shards=[]) == replace(full, shards=[])
    code, intact, err = _status(job)
    assert code == 1 and intact["counts"]["pending"] == 4 and intact["rows_total"] == 40, err[-3000:]
    RECORD_CASES[case](job)
    assert _status(job) == (code, intact, ""), "the same status, from the manifest itself"


def test_status_refuses_a_manifest_damaged_after_its_rows_record_was_written(tmp_path):
    """The record was made from other bytes than the manifest's now: status decodes the manifest and
    reports its error (one line, exit 2), as without the record."""
    job = prepare(tmp_path)
    _wrong_sha(job)
    code, _, err = _status(job)
    assert code == 2 and "checksum mismatch" in err and f"{job}/manifest.json" in err, err[-3000:]
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
