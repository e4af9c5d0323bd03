"""Fault matrix row 18: operator code changed during a job.

Prepare records a fingerprint of the code each stage runs (operator source files, the
``custom_operator_paths`` contents, Data-Juicer / plugin / Ray versions).  A worker whose
code differs refuses to claim, naming what differs, exit 2, and claims nothing, so one
job's output never mixes two versions of an operator.  ``--allow-version-mismatch`` lets
versions differ, never the code.  Through ``dj-elastic prepare / worker / merge``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from data_juicer_elastic.jobdir.manifest import load_manifest, load_plan
from data_juicer_elastic.jobdir.records import Manifest

from .commands import E2E_OPS, dj_elastic, error_line, merged_rows, slow_job

pytestmark = [pytest.mark.ray]


def _claims(job: Path) -> list[str]:
    return sorted(str(p.relative_to(job)) for p in job.glob("claims/*/gen-*.json"))


def _rewrite(job: Path, manifest: Manifest) -> None:
    path = job / "manifest.json"
    path.unlink()  # a hard link of a staged file: replace, never edit in place
    path.write_bytes(manifest.encode())  # encode() writes a matching checksum


@pytest.mark.extended
def test_changed_operator_code_is_refused_and_version_drift_needs_the_flag(tmp_path):
    ops = tmp_path / "ops" / "e2e_ops.py"
    ops.parent.mkdir()
    shutil.copy(E2E_OPS, ops)
    job = slow_job(tmp_path, 12, 0.0, ops=ops)
    code = load_plan(job).code  # recorded when the job was planned
    assert code and code["operators"]["e2e_sleep_mapper"] and str(ops) in code["custom_operator_paths"]
    assert set(code["versions"]) == {"data_juicer", "data_juicer_elastic", "ray"}

    original = ops.read_bytes()
    ops.write_bytes(original.replace(b"time.sleep(self.seconds_per_row)", b"sample['edited'] = 1"))
    for flags in ([], ["--allow-version-mismatch"]):  # code is never a "version"
        line = error_line(dj_elastic("worker", "--job-dir", job, *flags))
        assert "different operator code" in line and "e2e_sleep_mapper" in line and str(ops) in line
        assert _claims(job) == [], "a worker running other code claims nothing"

    ops.write_bytes(original)
    manifest = load_manifest(job)
    drifted = {**manifest.code, "versions": {**manifest.code["versions"], "ray": "2.59.0"}}
    _rewrite(job, Manifest(**{**manifest.__dict__, "code": drifted, "checksum": None}))
    line = error_line(dj_elastic("worker", "--job-dir", job))
    assert "versions differ" in line and "2.59.0" in line and "--allow-version-mismatch" in line
    assert _claims(job) == []

    proc = dj_elastic("worker", "--job-dir", job, "--allow-version-mismatch")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = merged_rows(job, tmp_path / "merged.jsonl")
    assert [r["id"] for r in rows] == list(range(12)) and not any("edited" in r for r in rows)
