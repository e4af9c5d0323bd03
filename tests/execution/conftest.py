"""Shared fixtures: ONE local Ray runtime for every Ray test of this folder.

A Ray start costs seconds and ~600 MB, so the runtime is session-scoped and
every ShardRunner test reuses it, which is also the property under test.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from data_juicer_elastic.rows.shard_source import ShardSource, SourceSpan

TEST_OPS = str(Path(__file__).parent / "dj_elastic_test_ops")

BASE_RECIPE = {
    "executor_type": "ray",
    "project_name": "dj-elastic-test",
    "np": 2,
    "text_keys": "text",
    "custom_operator_paths": [TEST_OPS],
    "process": [
        {"whitespace_normalization_mapper": {}},
        {"text_length_filter": {"min_len": 10, "max_len": 10000}},
    ],
}


def recipe(**changes) -> dict:
    return json.loads(json.dumps({**BASE_RECIPE, **changes}))


def write_shard(path: Path, rows: int, *, tag: str = "", start: int = 0) -> Path:
    """Rows with an ``idx`` in input order, unicode, odd whitespace, and some too short to pass the filter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(start, start + rows):
            if i % 7 == 3:
                text = f"short{i % 10}"  # < 10 chars: filtered out
            else:
                text = f"  row {tag} {i}\u3000héllo wörld / ünïcode 测试 \t" + "x" * (i % 40)
            handle.write(json.dumps({"text": text, "idx": i, "meta": {"tag": tag}}, ensure_ascii=False) + "\n")
    return path


def file_source(path: Path, shard_id: str) -> ShardSource:
    """A shard that is one whole input file, read in place (what a one-shard plan of it gives)."""
    content, stat = path.read_bytes(), path.stat()
    rows = content.count(b"\n")
    span = SourceSpan(str(path), 0, len(content), "none", stat.st_size, stat.st_mtime_ns, rows)
    return ShardSource(shard_id, (span,), len(content), hashlib.sha256(content).hexdigest(), 0)


def schema_of(*paths: Path) -> list:
    """The row schema prepare would publish for these files (what a job's runner is given)."""
    from data_juicer_elastic.rows.row_schema import RowSchema

    schema = RowSchema()
    for path in paths:
        schema.observe_all(read_jsonl(path))
    return schema.to_json()


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@pytest.fixture(scope="session")
def ray_runtime(tmp_path_factory) -> Iterator:
    from data_juicer_elastic.execution.ray_runtime import WarmRayRuntime
    from data_juicer_elastic.execution.shard_runner import shard_runtime_env

    cache = tmp_path_factory.mktemp("cache")
    runtime = WarmRayRuntime("local", num_cpus=2, runtime_env=shard_runtime_env(BASE_RECIPE, cache))
    with runtime:
        yield runtime


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("job-cache")
