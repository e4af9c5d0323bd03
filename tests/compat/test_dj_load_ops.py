"""compat.dj_load_ops: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

import pytest

from data_juicer_elastic.compat import dj_load_ops
from data_juicer_elastic.errors import IntegrationError


def test_self_check():
    assert "load_ops" in dj_load_ops.self_check()


def test_load_ops_and_the_planner_are_swapped_and_restored():
    import data_juicer.ops as ops
    import data_juicer.utils.process_utils as process_utils

    load, plan = ops.load_ops, process_utils.calculate_ray_np
    with dj_load_ops.load_ops_replaced(lambda original, items, env: ["built"], lambda original, operators: "planned"):
        assert ops.load_ops([]) == ["built"]
        assert process_utils.calculate_ray_np([]) == "planned"
        assert ops.load_ops.__wrapped__ is load
    assert ops.load_ops is load and process_utils.calculate_ray_np is plan


def test_a_moved_global_names_itself():
    with pytest.raises(IntegrationError, match="data_juicer.ops.no_such_function is missing"):
        dj_load_ops.target_module("data_juicer.ops", "no_such_function")
