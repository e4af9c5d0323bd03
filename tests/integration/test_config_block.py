"""The elastic: block: parser arguments from ElasticSettings, and settings_from_cfg."""

from __future__ import annotations

import pytest
from jsonargparse import ArgumentParser, Namespace

from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.integration.config_block import add_elastic_arguments, settings_from_cfg
from data_juicer_elastic.settings import ElasticSettings, field_help


def parser() -> ArgumentParser:
    p = ArgumentParser(default_env=True, prog="t")
    add_elastic_arguments(p)
    return p


def test_every_field_has_help():
    docs = field_help()
    assert set(docs) == set(ElasticSettings.field_names())
    assert all(docs.values())


def test_defaults_come_from_the_dataclass():
    cfg = parser().parse_args([])
    assert cfg.elastic.job_dir is None
    settings = settings_from_cfg(parser().parse_args(["--elastic.job_dir", "/j"]))
    assert settings == ElasticSettings(job_dir="/j")


def test_cli_and_env_values_are_typed(monkeypatch):
    monkeypatch.setenv("T_ELASTIC__MAX_SHARDS", "4")
    cfg = parser().parse_args(["--elastic.job_dir", "/j", "--elastic.lease_ttl_secs", "30"])
    settings = settings_from_cfg(cfg)
    assert settings.lease_ttl_secs == 30.0 and settings.max_shards == 4


def test_type_errors_exit_2():
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["--elastic.num_shards", "many"])
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("args", "where"),
    [
        ([], "elastic.job_dir"),
        (["--elastic.job_dir", "/j", "--elastic.num_shards", "0"], "elastic.num_shards"),
        (["--elastic.job_dir", "/j", "--elastic.max_retries", "-1"], "elastic.max_retries"),
    ],
)
def test_value_errors_name_the_field(args, where):
    with pytest.raises(ConfigError) as info:
        settings_from_cfg(parser().parse_args(args))
    assert info.value.where == where


def test_missing_block_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        settings_from_cfg(Namespace(executor_type="elastic_sharded"))
    assert info.value.where == "elastic"
