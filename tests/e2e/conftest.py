"""Helpers for end-to-end tests: real `dj-process`, `dj-analyze` and `dj-elastic` in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
OPS_DIR = Path(__file__).resolve().parent / "ops"
sys.path.insert(0, str(REPO / "demos"))
from generate_data import write_dataset  # noqa: E402

DEMO_PROCESS = [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 10, "max_len": 10000}}]
# Ray on these 2-core machines: one CPU per runtime keeps concurrent workers from starving each other.
RAY_CPUS = 1


def run(cmd: list[str], *, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def write_recipe(path: Path, **fields) -> Path:
    recipe = {"project_name": "e2e", "np": 1, "process": DEMO_PROCESS}
    recipe.update(fields)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def elastic_recipe(tmp: Path, data: Path, *, name: str = "job", process=None, **elastic) -> Path:
    settings = {"job_dir": str(tmp / name / "job"), "num_shards": 4, "ray_num_cpus": RAY_CPUS}
    settings.update(elastic)
    fields = {
        "executor_type": "elastic_sharded",
        "dataset_path": str(data),
        "export_path": str(tmp / name / "merged.jsonl"),
        "elastic": settings,
    }
    if process is not None:
        fields["process"] = process
    return write_recipe(tmp / f"{name}.yaml", **fields)


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_ray_output(path: Path) -> list[dict]:
    """Rows of a plain `ray` executor export (a directory of part files, or one file)."""
    if path.is_file():
        return read_jsonl(path)
    rows: list[dict] = []
    for part in sorted(path.iterdir()):
        rows += read_jsonl(part)
    return rows


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"
    )


@pytest.fixture(scope="session")
def demo_input(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "input.jsonl", rows=600, seed=7)
