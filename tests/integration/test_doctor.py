"""doctor checks: integration wiring and job-directory filesystem semantics."""

from __future__ import annotations

import os

from data_juicer_elastic.integration import patch_records
from data_juicer_elastic.integration.doctor import (
    DEDUP_DEPENDENCIES,
    dependency_checks,
    filesystem_checks,
    integration_checks,
)


def test_integration_checks_all_pass():
    checks = integration_checks()
    # the deduplicators' packages warn where missing (dependency_checks, tested below)
    assert all(c.ok for c in checks if not c.name.startswith("dependency ")), [c for c in checks if not c.ok]
    names = {c.name for c in checks}
    expected = {"entry point installed", "entry point loaded", "Data-Juicer version", "parser accepts elastic_sharded"}
    assert expected <= names
    assert {f"patch {target}" for target in patch_records.RECORDS} <= names


def test_integration_checks_report_a_moved_internal(patch_states):
    patch_records.mark(patch_records.CREATE_EXECUTOR, "missing", "not found")
    failed = [c for c in integration_checks() if not c.ok]
    assert [c.name for c in failed] == [f"patch {patch_records.CREATE_EXECUTOR}"]
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


MOUNTINFO = """\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
40 22 0:51 / /mnt/nas rw,relatime shared:30 - nfs4 nas:/export rw,vers=4.2,rsize=1048576,hard,proto=tcp
41 22 0:52 / /mnt/fast rw,relatime - nfs nas:/fast rw,vers=3,actimeo=3,hard
42 22 0:53 / /mnt/noac rw - nfs4 nas:/x rw,noac
43 22 0:54 / /mnt/fuse rw - fuse.sshfs host:/y rw,user_id=0
44 40 0:55 / /mnt/nas/scratch rw - ext4 /dev/vdb rw
45 22 0:56 / /mnt/with\\040space rw - nfs4 nas:/z rw,acdirmax=30,acregmax=10
"""


def test_the_mount_holding_a_path_and_its_cache_lag_are_read_from_mountinfo():
    from data_juicer_elastic.integration.mount_cache import cache_lag_secs, mount_of

    def lag(path):
        return cache_lag_secs(mount_of(path, MOUNTINFO))

    assert mount_of("/mnt/nas/jobs/j1", MOUNTINFO).mount_point == "/mnt/nas"
    assert mount_of("/mnt/nas/scratch/j", MOUNTINFO).fstype == "ext4", "the deepest mount point wins"
    assert mount_of("/mnt/nasty", MOUNTINFO).mount_point == "/", "a prefix of the name is not a parent"
    assert lag("/mnt/nas/j") == 60, "NFS without cache options: Linux's acdirmax default"
    assert lag("/mnt/fast/j") == 3 and lag("/mnt/noac/j") == 1 and lag("/mnt/with space/j") == 30
    assert lag("/srv/j") == 1 and lag("/mnt/fuse/j") is None


def test_lease_timing_is_judged_against_the_mount_with_settings_that_would_fix_it():
    from data_juicer_elastic.integration.mount_cache import advise, mount_of

    nas = mount_of("/mnt/nas/j", MOUNTINFO)
    defaults = advise(nas, 120, 30, "defaults")
    assert defaults.ok is False
    assert "cache lag up to 60 s" in defaults.detail and "3 x (C + H) = 270 s" in defaults.detail
    assert "lease_ttl_secs: 230 and heartbeat_interval_secs: 15" in defaults.detail and "actimeo=3" in defaults.detail
    assert advise(nas, 230, 15, "the job's").ok is True, "the suggested settings satisfy the rule"
    assert advise(mount_of("/mnt/fast/j", MOUNTINFO), 120, 30, "x").ok is True
    unknown = advise(mount_of("/mnt/fuse/j", MOUNTINFO), 120, 30, "x")
    assert unknown.ok is None and "unknown" in unknown.detail


def test_doctor_leads_with_one_verdict_and_lists_the_checks_with_v_or_on_failure(tmp_path):
    """The real ``dj-elastic doctor``: all good is one line (the ~40 checks of internals with ``-v``);
    a failure is the verdict naming what failed, then every check."""
    from tests.integration.conftest import console_script, run

    doctor = [console_script("dj-elastic"), "doctor", "--job-dir"]
    quiet, verbose = (run([*doctor, str(tmp_path), *flag], cwd=tmp_path) for flag in ([], ["-v"]))
    assert quiet.returncode == 0 and verbose.returncode == 0, quiet.stderr + verbose.stderr
    first = quiet.stdout.splitlines()[0]
    assert first.startswith("OK: executor_type elastic_sharded works with Data-Juicer ") and str(tmp_path) in first
    assert all(line.startswith("[warn]") for line in quiet.stdout.splitlines()[1:]), quiet.stdout
    lines = verbose.stdout.splitlines()
    assert lines[0] == first and len(lines) > 20, verbose.stdout
    line = next(x for x in lines if "lease timing vs mount cache" in x)
    assert line.startswith(("[ok]", "[warn]")), line
    assert "lease TTL 120 s, heartbeat 30 s (defaults: the job is not prepared)" in line

    failed = run([*doctor, str(tmp_path / "absent")], cwd=tmp_path)
    assert failed.returncode == 2, failed.stderr
    lines = failed.stdout.splitlines()
    assert lines[0].startswith("FAIL: 1 of ") and f"(directory {tmp_path / 'absent'})" in lines[0], lines[0]
    assert f"[FAIL] directory {tmp_path / 'absent'}: does not exist or is not a directory" in lines
    assert "[ok] entry point installed" in failed.stdout, "after a failure every check is listed"


def test_the_deduplicators_dependencies_are_pinned_in_setup_cfg_as_doctor_checks_them():
    from pathlib import Path

    setup_cfg = (Path(__file__).parents[2] / "setup.cfg").read_text()
    requires = {line.strip() for line in setup_cfg.split("install_requires =", 1)[1].split("\n[", 1)[0].splitlines()}
    for distribution, (_, requirement, _) in DEDUP_DEPENDENCIES.items():
        assert f"{distribution}{requirement}" in requires


def test_dependency_checks_pass_where_installed_and_warn_naming_the_install_where_not(monkeypatch):
    import importlib.util
    from importlib import metadata

    monkeypatch.setattr(metadata, "version", lambda name: {"scipy": "1.17.1", "simhash-pybind": "0.0.3"}[name])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    checks = dependency_checks()
    assert [c.name for c in checks] == ["dependency scipy", "dependency simhash-pybind"]
    assert all(c.ok and not c.warn for c in checks), checks

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "simhash" else object())
    scipy, simhash = dependency_checks()
    assert scipy.ok and not simhash.ok and simhash.warn
    assert "not installed" in simhash.detail and "pip install 'simhash-pybind==0.0.3'" in simhash.detail

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(metadata, "version", lambda name: {"scipy": "0.19.0", "simhash-pybind": "0.0.3"}[name])
    scipy, _ = dependency_checks()
    assert scipy.warn and "0.19.0 installed, >=1.11,<2 required" in scipy.detail


def test_dependency_checks_on_this_machine_match_what_is_importable():
    import importlib.util

    for check, (module, _, _) in zip(dependency_checks(), DEDUP_DEPENDENCIES.values(), strict=True):
        assert check.ok == (importlib.util.find_spec(module) is not None), check
