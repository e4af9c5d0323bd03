"""compat.dj_config_module: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

import os

from data_juicer_elastic.compat import dj_config_module


def test_self_check():
    assert "init_setup_from_cfg" in dj_config_module.self_check()


def test_a_missing_function_is_reported_not_raised():
    import types

    from data_juicer_elastic.compat import wrap_function

    assert wrap_function(types.ModuleType("config"), "build_base_parser", lambda f: f) == "function not found"


def test_the_log_file_name_is_fixed():
    seen, after = [], []
    setup_logger = dj_config_module.log_file_fixed(lambda **kwargs: seen.append(kwargs), lambda: after.append(1))
    setup_logger(filename=f"export_..{os.sep}merged.jsonl_time_1.txt")
    assert seen == [{"filename": "export_merged.jsonl_time_1.txt"}] and after == [1]


def test_base_parser_is_data_juicers_with_the_plugins_options():
    from data_juicer_elastic.compat import jsonargparse_actions

    parser = dj_config_module.base_parser()
    assert jsonargparse_actions.dests_starting(parser, "elastic.")
    assert "elastic_sharded" in jsonargparse_actions.action_for(parser, "executor_type").choices


def test_a_missing_base_parser_is_named(monkeypatch):
    import pytest
    from data_juicer.config import config

    from data_juicer_elastic.errors import IntegrationError

    monkeypatch.delattr(config, "build_base_parser")
    with pytest.raises(IntegrationError, match="data_juicer.config.config.build_base_parser is missing"):
        dj_config_module.base_parser()
    with pytest.raises(IntegrationError, match="build_base_parser"):
        dj_config_module.self_check()
