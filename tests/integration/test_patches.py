"""Dispatch, error boundary and ExecutorFactory, in process (the executor is a stand-in)."""

from __future__ import annotations

import sys
import types

import pytest

from data_juicer_elastic.compat.targets import is_installed
from data_juicer_elastic.errors import ConfigError, IntegrationError, ShardFailedError
from data_juicer_elastic.integration import dispatch, patch_records, patches
from tests.integration.conftest import elastic_recipe


@pytest.fixture
def process_data():
    from data_juicer.tools import process_data

    return process_data


def test_every_patch_is_applied():
    from data_juicer.core.executor import factory  # noqa: F401 - apply the deferred patch
    from data_juicer.tools import analyze_data, process_data  # noqa: F401

    assert patches.installed()
    assert {k: r.state for k, r in patch_records.RECORDS.items()} == {k: "applied" for k in patch_records.RECORDS}


def test_factory_returns_the_elastic_executor_class(stand_in_executor):
    from data_juicer.core.executor import ExecutorFactory

    _, executor = stand_in_executor
    assert ExecutorFactory.create_executor("elastic_sharded") is executor
    assert ExecutorFactory.create_executor(executor_type="elastic_sharded") is executor


def test_factory_builtins_unchanged():
    from data_juicer.core.executor import DefaultExecutor, ExecutorFactory
    from data_juicer.core.executor.ray_executor import RayExecutor

    assert ExecutorFactory.create_executor("default") is DefaultExecutor
    assert ExecutorFactory.create_executor("local") is DefaultExecutor
    assert ExecutorFactory.create_executor("ray") is RayExecutor
    with pytest.raises(ValueError):
        ExecutorFactory.create_executor("no_such_type")


def test_factory_refuses_elastic_when_an_internal_moved(patch_states):
    from data_juicer.core.executor import ExecutorFactory

    patch_records.mark(patch_records.INIT_SETUP, "missing", "function not found")
    with pytest.raises(IntegrationError, match="init_setup_from_cfg"):
        ExecutorFactory.create_executor("elastic_sharded")
    assert ExecutorFactory.create_executor("default").__name__ == "DefaultExecutor"


def _count_init_configs(monkeypatch, module):
    calls = []
    real = module.init_configs

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "init_configs", counting)
    return calls


def test_main_dispatches_elastic_after_one_parse(
    tmp_path, dataset, write_recipe, stand_in_executor, process_data, monkeypatch
):
    runs, _ = stand_in_executor
    recipe = write_recipe(**elastic_recipe(dataset, tmp_path))
    monkeypatch.setattr(sys, "argv", ["dj-process", "--config", str(recipe), "--elastic.num_shards", "5"])
    calls = _count_init_configs(monkeypatch, process_data)
    process_data.main()
    assert len(calls) == 1
    assert len(runs) == 1
    cfg = runs[0]
    assert cfg.executor_type == "elastic_sharded"
    assert cfg.elastic.num_shards == 5
    assert process_data.init_configs.__name__ == "counting"  # the swap was undone


def test_executor_error_is_one_line_exit_2(
    tmp_path, dataset, write_recipe, stand_in_executor, process_data, monkeypatch, capsys
):
    _, executor = stand_in_executor
    executor.error = ShardFailedError("2 shards failed", where="part-00001-of-00002", hint="dj-elastic retry")
    recipe = write_recipe(**elastic_recipe(dataset, tmp_path))
    monkeypatch.setattr(sys, "argv", ["dj-process", "--config", str(recipe)])
    with pytest.raises(SystemExit) as exit_info:
        process_data.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        "dj-process: error: ShardFailedError: part-00001-of-00002: 2 shards failed (dj-elastic retry)"
    )


def test_builtin_types_go_through_data_juicers_main(process_data, monkeypatch):
    sentinel = types.SimpleNamespace(executor_type="no_such_type")
    monkeypatch.setattr(process_data, "init_configs", lambda *a, **k: sentinel)
    # Data-Juicer's own main rejects it: proof the cfg went back to its if/elif.
    with pytest.raises(ValueError, match="Unsupported executor type: no_such_type"):
        process_data.main()


def test_config_error_inside_init_configs_becomes_exit_2(process_data, monkeypatch, capsys):
    def failing(*args, **kwargs):
        raise ConfigError("invalid value -1: must be an integer >= 1", where="elastic.num_shards")

    monkeypatch.setattr(process_data, "init_configs", failing)
    with pytest.raises(SystemExit) as exit_info:
        process_data.main()
    assert exit_info.value.code == 2
    assert "elastic.num_shards" in capsys.readouterr().err


def test_moved_config_names_are_recorded_not_raised(patch_states):
    empty = types.ModuleType("data_juicer.config.config")
    patches._patch_config(empty)
    assert patch_states[patch_records.BUILD_PARSER].state == "missing"
    assert patch_states[patch_records.INIT_SETUP].state == "missing"
    with pytest.raises(IntegrationError) as info:
        patch_records.require_integration()
    assert "build_base_parser" in str(info.value) and "init_setup_from_cfg" in str(info.value)


def test_moved_tool_main_is_recorded(patch_states):
    tool = types.ModuleType("data_juicer.tools.process_data")
    tool.main = lambda: None  # a main that no longer reads a module-level init_configs
    dispatch.patch_tool(tool, record=patch_records.PROCESS_MAIN, dispatch=True)
    assert patch_states[patch_records.PROCESS_MAIN].state == "missing"
    assert not is_installed(tool.main)


def test_moved_factory_is_recorded(patch_states):
    factory = types.ModuleType("data_juicer.core.executor.factory")
    factory.ExecutorFactory = type("ExecutorFactory", (), {"create_executor": lambda self, t: t})
    patches._patch_factory(factory)
    assert patch_states[patch_records.CREATE_EXECUTOR].state == "missing"
    assert "no longer a static/class method" in patch_states[patch_records.CREATE_EXECUTOR].detail


def test_parser_without_executor_type_is_recorded(patch_states):
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    patches.extend_parser(parser)
    assert patch_states[patch_records.BUILD_PARSER].state == "missing"
    assert parser.parse_args(["--elastic.num_shards", "3"]).elastic.num_shards == 3


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--executor_type", "elastic_sharded"], {}, True),
        (["--executor_type=elastic_sharded"], {}, True),
        (["--executor_type", "default"], {}, False),
        ([], {"DJ_PROCESS_EXECUTOR_TYPE": "elastic_sharded"}, True),
    ],
)
def test_requests_elastic(argv, env, expected, monkeypatch):
    monkeypatch.delenv("DJ_PROCESS_EXECUTOR_TYPE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert dispatch.requests_elastic(argv) is expected


def test_requests_elastic_reads_the_config_file(tmp_path, write_recipe, dataset):
    elastic = write_recipe("e.yaml", **elastic_recipe(dataset, tmp_path))
    plain = write_recipe("p.yaml", executor_type="default")
    assert dispatch.requests_elastic(["--config", str(elastic)])
    assert dispatch.requests_elastic([f"--config={elastic}"])
    assert not dispatch.requests_elastic(["--config", str(plain)])
    assert not dispatch.requests_elastic(["--config", str(tmp_path / "missing.yaml")])
