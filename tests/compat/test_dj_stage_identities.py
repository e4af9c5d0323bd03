"""compat.dj_stage_identities: its self-check passes against the installed packages, and fails naming
the function when Data-Juicer's stage identity code is missing; without it an adaptive-batching
operator is refused when it is built (its shared profiles are keyed by those identities)."""

from __future__ import annotations

import sys

import pytest

from data_juicer_elastic import DATA_JUICER_REQUIREMENT
from data_juicer_elastic.compat import dj_stage_identities
from data_juicer_elastic.errors import IntegrationError


def test_self_check():
    found = dj_stage_identities.self_check()
    assert "_resolved_stage_identities" in found
    assert all(name in found for name in dj_stage_identities.FUNCTIONS)


@pytest.mark.parametrize("name", dj_stage_identities.FUNCTIONS)
def test_a_missing_function_fails_the_self_check_naming_it(monkeypatch, name):
    import data_juicer.core.elasticjuicer.stage_identity as code

    monkeypatch.delattr(code, name)
    with pytest.raises(IntegrationError) as info:
        dj_stage_identities.self_check()
    assert f"{dj_stage_identities.IDENTITY_MODULE}.{name} is missing" in str(info.value)
    assert DATA_JUICER_REQUIREMENT in str(info.value)


def test_a_missing_module_fails_the_self_check_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, dj_stage_identities.IDENTITY_MODULE, None)  # import raises ImportError
    with pytest.raises(IntegrationError, match=f"cannot import {dj_stage_identities.IDENTITY_MODULE}"):
        dj_stage_identities.self_check()


def test_doctor_reports_the_missing_function(monkeypatch):
    import data_juicer.core.elasticjuicer.stage_identity as code

    from data_juicer_elastic.integration.doctor import compat_checks

    monkeypatch.delattr(code, "operator_fingerprint")
    failed = [check for check in compat_checks() if not check.ok]
    assert [check.name for check in failed] == ["compat dj_stage_identities"]
    assert "operator_fingerprint is missing" in failed[0].detail


def test_the_functions_are_data_juicers(monkeypatch):
    import data_juicer.core.elasticjuicer.stage_identity as code

    monkeypatch.setattr(code, "operator_fingerprint", lambda op: f"fp-{op}")
    monkeypatch.setattr(code, "assign_stage_identities", lambda ops: {"stages": list(ops)})
    assert dj_stage_identities.op_fingerprint("x") == "fp-x"
    assert dj_stage_identities.identity_manifest(["a", "b"]) == {"stages": ["a", "b"]}


def test_an_adaptive_operator_is_refused_without_the_fingerprint(monkeypatch):
    import data_juicer.core.elasticjuicer.stage_identity as code
    from data_juicer.ops.base_op import OPERATORS

    from data_juicer_elastic.batching.demo import NAME as DEMO

    build = OPERATORS.modules[DEMO]
    build(capacity=400, batch_size=64, adaptive_batching=True, torch_errors=False)  # builds while it exists
    monkeypatch.delattr(code, "operator_fingerprint")
    with pytest.raises(IntegrationError, match="operator_fingerprint is missing"):
        build(capacity=400, batch_size=64, adaptive_batching=True, torch_errors=False)
    build(capacity=400, batch_size=64, adaptive_batching=False, torch_errors=False)  # not adaptive: unaffected


def test_stamped_identities_are_a_copy():
    import types

    cfg, manifest = types.SimpleNamespace(), [{"stage_id": "s0"}]
    assert dj_stage_identities.stamped(cfg) is None
    dj_stage_identities.stamp(cfg, manifest)
    assert dj_stage_identities.stamped(cfg) == manifest and dj_stage_identities.stamped(cfg) is not manifest
