"""More rows failing than ``elastic.max_error_rows`` allows: the job fails naming the first, and
nothing is published (a file apart from test_quarantine.py, so the two real runs can go to
different test processes). The recipe is the failing Mapper alone: test_quarantine.py runs the
Filter in Ray actor mode, whose warm actor would double this run's cost without a row failing in it."""

from __future__ import annotations

import os
import subprocess

import pytest

from .conftest import OPS_DIR
from .test_quarantine import MAPPER_FAILS, recipe, write_input

pytestmark = [pytest.mark.e2e, pytest.mark.ray]


def test_more_failing_rows_than_max_error_rows_fail_the_job_naming_the_first(tmp_path):
    data = write_input(tmp_path / "input.jsonl")
    mapper_ids = tmp_path / "mapper.txt"
    mapper_ids.write_text("".join(f"{i}\n" for i in MAPPER_FAILS))
    config = recipe(tmp_path, "strict", data, "elastic_sharded", mapper_ids, None, OPS_DIR / "e2e_ops.py")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_JOB")}
    proc = subprocess.run(
        ["dj-process", "--config", config, "--elastic.max_error_rows", "2", "--elastic.max_retries", "0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    error = proc.stderr
    assert "operators failed on 3 of" in error and "more than elastic.max_error_rows=2 allows (2)" in error, error
    assert "the first: op[0] e2e_fail_ids_mapper: ValueError: e2e_fail_ids_mapper: cannot process id 7 (row 7)" in error
    assert (
        not (tmp_path / "strict" / "merged.jsonl").exists()
        and not (tmp_path / "strict" / "merged_errors.jsonl").exists()
    )
