"""compat.dj_config_internals: Data-Juicer's parser, config setup, tools' ``main`` and the
globals a shard run swaps; each check passes against the installed packages (an upgrade that moves an
internal fails here, naming it)."""

from __future__ import annotations

import os

import pytest

from data_juicer_elastic.compat import dj_config_internals
from data_juicer_elastic.errors import IntegrationError


def test_check_dj_config_module():
    assert "init_setup_from_cfg" in dj_config_internals.check_dj_config_module()


def test_a_missing_function_is_reported_not_raised():
    import types

    from data_juicer_elastic.compat.targets import wrap_function

    assert wrap_function(types.ModuleType("config"), "build_base_parser", lambda f: f) == "function not found"


def test_the_log_file_name_is_fixed():
    seen, after = [], []
    setup_logger = dj_config_internals.log_file_fixed(lambda **kwargs: seen.append(kwargs), lambda: after.append(1))
    setup_logger(filename=f"export_..{os.sep}merged.jsonl_time_1.txt")
    assert seen == [{"filename": "export_merged.jsonl_time_1.txt"}] and after == [1]


def test_base_parser_is_data_juicers_with_the_plugins_options():

    parser = dj_config_internals.base_parser()
    assert dj_config_internals.dests_starting(parser, "elastic.")
    assert "elastic_sharded" in dj_config_internals.action_for(parser, "executor_type").choices


def test_a_missing_base_parser_is_named(monkeypatch):
    import pytest
    from data_juicer.config import config

    from data_juicer_elastic.errors import IntegrationError

    monkeypatch.delattr(config, "build_base_parser")
    with pytest.raises(IntegrationError, match="data_juicer.config.config.build_base_parser is missing"):
        dj_config_internals.base_parser()
    with pytest.raises(IntegrationError, match="build_base_parser"):
        dj_config_internals.check_dj_config_module()


COUNTING = "import pathlib\nwith pathlib.Path({count!r}).open('a') as f:\n    f.write('x')\n"


def _counting_op(tmp_path, name):
    path = tmp_path / f"{name}.py"
    path.write_text(COUNTING.format(count=str(tmp_path / f"{name}.count")))
    return path, tmp_path / f"{name}.count"


def test_each_custom_operator_path_is_loaded_once_per_process(tmp_path):
    import uuid

    from data_juicer.config import config

    tag = uuid.uuid4().hex[:8]
    first, first_count = _counting_op(tmp_path, f"dj_elastic_once_a_{tag}")
    second, second_count = _counting_op(tmp_path, f"dj_elastic_once_b_{tag}")
    dj_config_internals.load_custom_operators([str(first)])
    dj_config_internals.load_custom_operators([str(first), str(second)])  # one loaded, one not
    config.load_custom_operators([str(second), str(first)])  # Data-Juicer's own call goes through the same rule
    assert first_count.read_text() == "x" and second_count.read_text() == "x"


def test_a_broken_custom_operator_is_one_error_naming_the_file_and_line_every_time(tmp_path):
    import uuid

    import pytest

    from data_juicer_elastic.errors import RecipeError

    broken = tmp_path / f"dj_elastic_broken_{uuid.uuid4().hex[:8]}.py"
    broken.write_text("import os\n\nimport dj_elastic_no_such_module\n")
    errors = []
    for _ in range(2):  # a failed load leaves nothing behind that a second try would take for loaded
        with pytest.raises(RecipeError) as info:
            dj_config_internals.load_custom_operators([str(broken)])
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert info.value.where == f"{broken}:3"
    assert "ModuleNotFoundError" in info.value.message and "custom_operator_paths" in info.value.hint
    with pytest.raises(RecipeError) as missing:
        dj_config_internals.load_custom_operators([str(tmp_path / "no_such_ops.py")])
    assert missing.value.where == str(tmp_path / "no_such_ops.py")


def test_check_jsonargparse_actions():
    assert "_actions" in dj_config_internals.check_jsonargparse_actions()


def test_data_juicers_parser_has_the_executor_type_action():
    from data_juicer.config.config import build_base_parser

    action = dj_config_internals.action_for(build_base_parser(), "executor_type")
    assert "elastic_sharded" in action.choices


def test_check_dj_tool_main():
    assert "process_data.main" in dj_config_internals.check_dj_tool_main()


def test_a_main_without_module_level_init_configs_is_reported():
    import types

    tool = types.ModuleType("data_juicer.tools.process_data")
    tool.main = lambda: None
    assert (
        dj_config_internals.wrap_main(tool, lambda *a: None) == "its module no longer calls a module-level init_configs"
    )


def test_check_dj_load_ops():
    assert "load_ops" in dj_config_internals.check_dj_load_ops()


def test_load_ops_and_the_planner_are_swapped_and_restored():
    import data_juicer.ops as ops
    import data_juicer.utils.process_utils as process_utils

    load, plan = ops.load_ops, process_utils.calculate_ray_np
    with dj_config_internals.load_ops_replaced(
        lambda original, items, env: ["built"], lambda original, operators: "planned"
    ):
        assert ops.load_ops([]) == ["built"]
        assert process_utils.calculate_ray_np([]) == "planned"
        assert ops.load_ops.__wrapped__ is load
    assert ops.load_ops is load and process_utils.calculate_ray_np is plan


def test_a_moved_global_names_itself():
    with pytest.raises(IntegrationError, match="data_juicer.ops.no_such_function is missing"):
        dj_config_internals.target_module("data_juicer.ops", "no_such_function")
