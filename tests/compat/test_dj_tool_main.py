"""compat.dj_tool_main: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

from data_juicer_elastic.compat import dj_tool_main


def test_self_check():
    assert "process_data.main" in dj_tool_main.self_check()


def test_a_main_without_module_level_init_configs_is_reported():
    import types

    tool = types.ModuleType("data_juicer.tools.process_data")
    tool.main = lambda: None
    assert dj_tool_main.wrap_main(tool, lambda *a: None) == "its module no longer calls a module-level init_configs"
