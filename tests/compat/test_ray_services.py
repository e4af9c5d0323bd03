"""compat.ray_services: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

from data_juicer_elastic.compat import ray_services


def test_self_check():
    assert "canonicalize_bootstrap_address" in ray_services.self_check()
