"""compat.dj_resource_utils: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

from data_juicer_elastic.compat import dj_resource_utils


def test_self_check():
    assert "check_and_initialize_ray" in dj_resource_utils.self_check()


def test_ray_is_never_started_inside_and_the_probe_is_restored():
    from data_juicer.utils import resource_utils

    original = resource_utils.check_and_initialize_ray
    with dj_resource_utils.no_ray_start():
        assert resource_utils.check_and_initialize_ray() is False
    assert resource_utils.check_and_initialize_ray is original
