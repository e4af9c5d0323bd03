"""Fault matrix row 24: what editors and users leave beside custom operators.

The code fingerprint covers what Python would import from ``custom_operator_paths``
(``execution.code_fingerprint.importable_files``): an Emacs lock file (a dangling ``.#ops.py``
link while the file is edited), a backup, notes beside the package are no code, so
neither ``dj-elastic prepare`` nor a worker of a job prepared before they appeared trips
over them; an edit of an imported module is still refused.  Through ``dj-elastic``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .commands import E2E_OPS, dj_elastic, error_line, merged_rows, slow_job


def _package(tmp: Path, *, junk: bool) -> Path:
    package = tmp / "my_ops"
    package.mkdir(parents=True)
    shutil.copy(E2E_OPS, package / "e2e_ops.py")
    (package / "__init__.py").write_text("from . import e2e_ops  # noqa: F401\n")
    if junk:
        _leave_junk(package)
    return package


def _leave_junk(package: Path) -> None:
    (package / ".#e2e_ops.py").symlink_to("someone@host.4242:1700000000")  # Emacs, while e2e_ops.py is edited
    (package / "e2e_ops.py~").write_text("# an editor's backup\n")
    (package / "NOTES.txt").write_text("not code\n")


def test_prepare_ignores_what_python_would_not_import(tmp_path):
    package = _package(tmp_path, junk=True)
    job = slow_job(tmp_path, 6, 0.0, ops=package)  # dj-elastic prepare: exit 0 (asserted there)
    assert (job / "plan.json").is_file()  # planned, with the code's fingerprint


@pytest.mark.ray
@pytest.mark.extended  # a real worker; the fingerprint is checked against Python's own import system in tests/execution
def test_editor_lock_files_neither_stop_prepare_nor_a_worker(tmp_path):
    package = _package(tmp_path / "a", junk=False)
    job = slow_job(tmp_path / "a", 6, 0.0, ops=package)  # prepared before the junk appeared
    _leave_junk(package)
    proc = dj_elastic("worker", "--job-dir", job)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [row["id"] for row in merged_rows(job, tmp_path / "merged.jsonl")] == list(range(6))

    package = _package(tmp_path / "b", junk=True)
    job = slow_job(tmp_path / "b", 6, 0.0, ops=package)  # prepared with the junk there: exit 0 (asserted there)
    module = package / "e2e_ops.py"  # what Python imports still counts
    module.write_text(module.read_text() + "\n# edited\n")
    line = error_line(dj_elastic("worker", "--job-dir", job))
    assert "different operator code" in line and str(package) in line
