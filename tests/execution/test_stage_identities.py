"""compute_stage_identities without Ray; error helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from data_juicer_elastic.errors import RecipeError, StageIdentityMismatch
from data_juicer_elastic.execution.shard_runner import last_meaningful_line
from data_juicer_elastic.execution.stage_identities import compute_stage_identities, verify_stage_identities

RECIPE = {
    "executor_type": "ray",
    "project_name": "demo",
    "np": 2,
    "text_keys": "text",
    "process": [
        {"whitespace_normalization_mapper": {}},
        {"text_length_filter": {"min_len": 10, "max_len": 10000}},
        {"whitespace_normalization_mapper": {}},
    ],
}


def test_identities_format_and_repeated_operators():
    ids = compute_stage_identities(RECIPE)
    assert len(ids) == 3
    assert ids[0].startswith("stage-0000-occ0-") and ids[0].endswith(":whitespace_normalization_mapper")
    assert ids[1].startswith("stage-0001-occ0-") and ids[1].endswith(":text_length_filter")
    assert ids[2].startswith("stage-0002-occ1-")  # same fingerprint as stage 0: second occurrence
    assert ids[0].split("-")[3] == ids[2].split("-")[3]


def test_identities_ignore_np_and_paths_but_not_operator_arguments():
    base = compute_stage_identities(RECIPE)
    assert compute_stage_identities({**RECIPE, "np": 1, "project_name": "other"}) == base
    changed = json.loads(json.dumps(RECIPE))
    changed["process"][1]["text_length_filter"]["min_len"] = 11
    other = compute_stage_identities(changed)
    assert other[0] == base[0] and other[1] != base[1]


def test_compute_does_not_start_ray_or_leak_ray_job_env():
    code = (
        "import json, os, sys\n"
        "from data_juicer_elastic.execution.stage_identities import compute_stage_identities\n"
        f"ids = compute_stage_identities({RECIPE!r})\n"
        "ray = sys.modules.get('ray')\n"
        "print(json.dumps({'ids': ids, 'ray': bool(ray and ray.is_initialized()),"
        " 'env': os.environ.get('RAY_JOB')}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_JOB"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"ids": compute_stage_identities(RECIPE), "ray": False, "env": None}


def test_invalid_recipes_are_recipe_errors():
    with pytest.raises(RecipeError, match="text_key"):
        compute_stage_identities({**RECIPE, "text_key": "text"})
    with pytest.raises(RecipeError, match="elastic"):
        compute_stage_identities({**RECIPE, "elastic": {"job_dir": "/x"}})
    with pytest.raises(RecipeError, match="executor_type 'default'"):
        compute_stage_identities({**RECIPE, "executor_type": "default"})


def test_mismatch_names_the_first_differing_stage():
    with pytest.raises(StageIdentityMismatch) as info:
        verify_stage_identities(["a", "b", "c"], ["a", "x"], where="shard part-00001-of-00002")
    text = str(info.value)
    assert "stage 1 differs" in text and "'b'" in text and "'x'" in text
    with pytest.raises(StageIdentityMismatch, match="stage 2 differs.*'<no stage>'"):
        verify_stage_identities(["a", "b"], ["a", "b", "c"], where="w")
    verify_stage_identities(["a"], ["a"], where="w")


def test_last_meaningful_line_prefers_the_operator_error():
    try:
        try:
            raise ValueError("boom: bad row")
        except ValueError as inner:
            raise RuntimeError("UDF failed to process a data block.\nTo change retry attempts, ...") from inner
    except RuntimeError as exc:
        assert last_meaningful_line(exc) == "ValueError: boom: bad row"
    assert last_meaningful_line(OSError("disk full")) == "OSError: disk full"
    assert len(last_meaningful_line(ValueError("x" * 1000))) == 400
    assert last_meaningful_line(KeyError("k")) == "KeyError: 'k'"
