"""compat.dj_executor_factory: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

from data_juicer_elastic.compat import dj_executor_factory


def test_self_check():
    assert "create_executor" in dj_executor_factory.self_check()
