"""Helpers for the integration tests: tiny datasets and recipes, dj-process subprocesses,
and a stand-in for ``data_juicer_elastic.executor`` (the real executor starts Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

ROWS = [" hello\u3000world ", "\tsecond\u2003row", "third  row ", "4th", " fifth\u00a0row"]


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "input.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for i, text in enumerate(ROWS):
            handle.write(json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n")
    return path


@pytest.fixture
def write_recipe(tmp_path: Path):
    def write(name: str = "recipe.yaml", **recipe) -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
        return path

    return write


def elastic_recipe(dataset: Path, tmp_path: Path, **overrides) -> dict:
    recipe = {
        "project_name": "elastic-test",
        "dataset_path": str(dataset),
        "export_path": str(tmp_path / "out" / "merged.jsonl"),
        "executor_type": "elastic_sharded",
        "np": 2,
        "elastic": {"job_dir": str(tmp_path / "job"), "num_shards": 2},
        "process": [
            {"whitespace_normalization_mapper": None},
            {"text_length_filter": {"min_len": 3}},
        ],
    }
    recipe.update(overrides)
    return recipe


def clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "DJ_PROCESS_"))}
    env.update(extra or {})
    return env


def run(args: list[str], *, cwd: Path, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=cwd, env=clean_env(env), capture_output=True, text=True, timeout=timeout, check=False
    )


def console_script(name: str) -> str:
    """The installed console script next to this interpreter (no pyenv shim)."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


STAND_IN_RUNNER = """
import json, os, sys, types
# Stand-in for data_juicer_elastic.executor: records what dispatch hands over.
module = types.ModuleType("data_juicer_elastic.executor")
class ElasticShardedExecutor:
    def __init__(self, cfg):
        self.cfg = cfg
    def run(self):
        from data_juicer_elastic.integration.recipe import build_shard_recipe
        import ray
        print("STAND-IN " + json.dumps({
            "executor_type": self.cfg.executor_type,
            "job_dir": self.cfg.elastic.job_dir,
            "ray_job_env": os.environ.get("RAY_JOB"),
            "ray_initialized": ray.is_initialized(),
            "recipe": build_shard_recipe(self.cfg),
        }))
module.ElasticShardedExecutor = ElasticShardedExecutor
sys.modules[module.__name__] = module
sys.argv[0] = "dj-process"
from data_juicer.tools.process_data import main
main()
"""


@pytest.fixture
def stand_in_executor(monkeypatch):
    """Replace data_juicer_elastic.executor in this process; returns the list of runs."""
    runs: list = []
    module = types.ModuleType("data_juicer_elastic.executor")

    class ElasticShardedExecutor:
        error: Exception | None = None

        def __init__(self, cfg):
            self.cfg = cfg

        def run(self):
            runs.append(self.cfg)
            if ElasticShardedExecutor.error is not None:
                raise ElasticShardedExecutor.error

    module.ElasticShardedExecutor = ElasticShardedExecutor
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return runs, ElasticShardedExecutor


@pytest.fixture
def patch_states():
    """Snapshot and restore the patch records around a test that simulates a moved internal."""
    from data_juicer_elastic.integration import patch_records

    saved = {k: (r.state, r.detail) for k, r in patch_records.RECORDS.items()}
    yield patch_records.RECORDS
    for key, (state, detail) in saved.items():
        patch_records.RECORDS[key].state, patch_records.RECORDS[key].detail = state, detail
