"""doctor checks: integration wiring and job-directory filesystem semantics."""

from __future__ import annotations

import os

from data_juicer_elastic.integration import patches
from data_juicer_elastic.integration.doctor import filesystem_checks, integration_checks


def test_integration_checks_all_pass():
    checks = integration_checks()
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    names = {c.name for c in checks}
    expected = {"entry point installed", "entry point loaded", "Data-Juicer version", "parser accepts elastic_sharded"}
    assert expected <= names
    assert {f"patch {target}" for target in patches.RECORDS} <= names


def test_integration_checks_report_a_moved_internal(patch_records):
    patches.mark(patches.CREATE_EXECUTOR, "missing", "not found")
    failed = [c for c in integration_checks() if not c.ok]
    assert [c.name for c in failed] == [f"patch {patches.CREATE_EXECUTOR}"]
    assert "not found" in failed[0].detail


def test_filesystem_checks_pass_and_clean_up(tmp_path):
    checks = filesystem_checks(tmp_path)
    assert [c.name for c in checks] == ["exclusive create (O_EXCL)", "hard link", "rename"]
    assert all(c.ok for c in checks), checks
    assert os.listdir(tmp_path) == []


def test_filesystem_checks_missing_directory(tmp_path):
    (check,) = filesystem_checks(tmp_path / "absent")
    assert not check.ok and "does not exist" in check.detail


def test_filesystem_checks_report_a_failing_link(tmp_path, monkeypatch):
    def no_link(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    checks = {c.name: c for c in filesystem_checks(tmp_path)}
    assert not checks["hard link"].ok and "hard links" in checks["hard link"].detail
    assert os.listdir(tmp_path) == []
