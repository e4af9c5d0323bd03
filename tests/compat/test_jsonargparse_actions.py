"""compat.jsonargparse_actions: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

from data_juicer_elastic.compat import jsonargparse_actions


def test_self_check():
    assert "_actions" in jsonargparse_actions.self_check()


def test_data_juicers_parser_has_the_executor_type_action():
    from data_juicer.config.config import build_base_parser

    action = jsonargparse_actions.action_for(build_base_parser(), "executor_type")
    assert "elastic_sharded" in action.choices
