"""Matrix row 10: a corrupt manifest (truncated, bad JSON, wrong sha, missing shard).

Every worker refuses before claiming anything, with one clear error naming the manifest
(or the shards folder) and exit code 2.
"""

from __future__ import annotations

import json
import subprocess

import pytest

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
