"""A zero-copy input edited in place (same size) while its shard runs, under an operator that fails on a row
and keeps none: the row read back for `<export>_errors.jsonl` must come from the content the shard's scan
hashed.  The shard is over one read block (8 MiB), so reading only up to the failing row never reaches the
end of the content, where its hash is compared; the job must fail naming the input (as any input changed
during the run does: docs/failure-semantics.md, row 11), never publish the edited row.  Extended tier: a
Ray run of its own; the default tier checks the same read with no Ray (tests/quarantine/test_errors_file.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from data_juicer_elastic.rows.codecs import READ_BYTES

from .conftest import OPS_DIR, elastic_recipe

pytestmark = [pytest.mark.extended, pytest.mark.e2e, pytest.mark.ray]

FAILS = 7  # the one row whose stats fail; the filter edits it in the input when it fails


def write_input(path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        i = 0
        while handle.tell() <= READ_BYTES + 64 * 1024:  # more than one read block: the failing row is in the first
            handle.write(json.dumps({"id": i, "text": f"row {i} " + "x" * 4000}) + "\n")
            i += 1
    return path


def test_input_edited_in_place_while_a_shard_keeping_no_row_runs_publishes_no_quarantined_row(tmp_path):
    data = write_input(tmp_path / "input.jsonl")
    original = data.read_bytes().splitlines()[FAILS]
    fail_ids = tmp_path / "fail.txt"
    fail_ids.write_text(f"{FAILS}\n")
    process = [
        {
            "e2e_edit_input_filter": {
                "fail_ids_path": str(fail_ids),
                "input_path": str(data),
                "old": f'"row {FAILS} x',
                "new": f'"row {FAILS} Z',
            }
        }
    ]
    config = elastic_recipe(tmp_path, data, process=process, num_shards=1)
    fields = config.read_text() + f"custom_operator_paths:\n- {OPS_DIR / 'e2e_ops.py'}\n"
    config.write_text(fields)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_JOB")}
    proc = subprocess.run(
        ["dj-process", "--config", config], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert data.read_bytes().splitlines()[FAILS] != original, "the filter edited the input while the shard ran"

    errors = tmp_path / "job" / "merged_errors.jsonl"
    published = errors.read_bytes() if errors.exists() else b""
    assert proc.returncode == 2, f"exit {proc.returncode}; errors file: {published[:200]!r}\n{proc.stderr[-3000:]}"
    last = proc.stderr.strip().splitlines()[-1]
    assert str(data) in last and "input changed since the job was planned and scanned" in last, last
    assert not errors.exists() and not (tmp_path / "job" / "merged.jsonl").exists(), "nothing published"
