"""compat.dj_stage_identities: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

from data_juicer_elastic.compat import dj_stage_identities


def test_self_check():
    assert "_resolved_stage_identities" in dj_stage_identities.self_check()


def test_stamped_identities_are_a_copy():
    import types

    cfg, manifest = types.SimpleNamespace(), [{"stage_id": "s0"}]
    assert dj_stage_identities.stamped(cfg) is None
    dj_stage_identities.stamp(cfg, manifest)
    assert dj_stage_identities.stamped(cfg) == manifest and dj_stage_identities.stamped(cfg) is not manifest
