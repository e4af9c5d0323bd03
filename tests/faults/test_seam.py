"""The fault-injection seam itself: nothing installed when unused, plans parsed strictly,
rules fire exactly as configured, and injected errors look like the real calls'."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.sharedfs import fault_seam, fsio

from . import crashpoints
from .crashpoints import CRASH_POINTS, FaultPlan, FaultRule, injected


def test_nothing_is_installed_when_the_environment_names_no_plan(monkeypatch):
    monkeypatch.delenv(crashpoints.CRASH_ENV, raising=False)
    monkeypatch.delenv(crashpoints.FAULTS_ENV, raising=False)
    assert crashpoints.install_from_env() is False
    assert fault_seam._fault_hook is None and fault_seam._done_hook is None


def test_plan_from_the_environment_is_installed_once(monkeypatch):
    monkeypatch.setenv(crashpoints.FAULTS_ENV, '[{"op": "fsync", "errno": "EIO", "times": null}]')
    try:
        assert crashpoints.install_from_env()
        first = crashpoints._installed
        assert crashpoints.install_from_env() and crashpoints._installed is first, "counters survive"
    finally:
        crashpoints.install(None)
    assert fault_seam._fault_hook is None


@pytest.mark.parametrize(
    "env, value",
    [("CRASH", "nowhere"), ("CRASH", "claim@0"), ("CRASH", "write:"), ("FAULTS", "{}"), ("FAULTS", "[{}]"),
     ("FAULTS", '[{"op": "write", "errno": "ENOENT"}]'), ("FAULTS", '[{"op": "write", "errno": "EIO", "mode": "x"}]')],
)  # fmt: skip
def test_bad_plans_are_config_errors_naming_the_variable(monkeypatch, env, value):
    name = crashpoints.CRASH_ENV if env == "CRASH" else crashpoints.FAULTS_ENV
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        crashpoints.install_from_env()
    assert info.value.where == name
    assert crashpoints._installed is None


def test_rules_skip_then_fire_a_bounded_number_of_times(tmp_path):
    rule = FaultRule("write", "ENOSPC", path="x", skip=2, times=2)
    fired = [rule.fires("write", tmp_path / "x") for _ in range(6)]
    assert fired == [False, False, True, True, False, False]
    assert not rule.fires("fsync", tmp_path / "x") and not rule.fires("write", tmp_path / "y")


def test_injected_errors_look_like_the_real_calls_and_fsio_names_the_path(tmp_path):
    with injected(FaultRule("write", "ENOSPC"), FaultRule("create", "EACCES", path="b")) as plan:
        with pytest.raises(OSError) as write_error:
            fsio.write_new(tmp_path / "a", b"data")
        with pytest.raises(PermissionError) as create_error:
            fsio.write_new(tmp_path / "b", b"data")
    assert plan.injected == [("write", str(tmp_path / "a"), "ENOSPC"), ("create", str(tmp_path / "b"), "EACCES")]
    assert write_error.value.errno == errno.ENOSPC and write_error.value.filename == str(tmp_path / "a")
    assert create_error.value.filename == str(tmp_path / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing half-written is left"
    assert fault_seam._fault_hook is None, "the context manager uninstalls"


def test_every_named_crash_point_is_reachable_by_an_operation_the_code_performs():
    performed = {"link", "write", "fsync", "rename", "merge", "finalize"}
    assert {point.op for point in CRASH_POINTS.values()} <= performed
    assert set(CRASH_POINTS) >= {"claim", "write", "fsync", "done", "merge", "finalize"}
    assert FaultPlan(crash="done@3").crash_hit == 3


def test_the_claim_point_is_a_shard_runs_claim_not_a_scans_or_the_summary_writers():
    """All three use the lease protocol; a test killing a worker at ``claim`` means the first."""
    claim = CRASH_POINTS["claim"]
    gen = "part-00000-of-00001/gen-000001.json"
    assert claim.matches("after", "link", Path(f"/job/claims/{gen}"))
    assert not claim.matches("after", "link", Path(f"/job/scans/claims/{gen}"))
    assert not claim.matches("after", "link", Path(f"/job/summary/claims/{gen}"))


def test_fsync_of_an_existing_file_names_it_and_a_lying_create_leaves_nothing(tmp_path):
    target = tmp_path / "output.jsonl"
    target.write_bytes(b"{}\n")
    with injected(FaultRule("fsync", "EIO")), pytest.raises(OSError) as info:
        fsio.fsync_file(target)
    assert info.value.errno == errno.EIO and info.value.filename == str(target)
    with injected(FaultRule("create", "EIO", mode="lie")), pytest.raises(OSError):
        fsio.write_new(tmp_path / "new.json", b"x")  # created, but reported failed: cleaned up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["output.jsonl"]
