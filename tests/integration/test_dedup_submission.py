"""Deduplicators at submission, through the real `dj-process`: a Ray version's tuning keys are named in
one warning line, and what elastic_sharded cannot run as Data-Juicer's default executor would, or what
Data-Juicer would refuse, exits 2 naming `process[i]` before anything is written."""

from __future__ import annotations

import pytest

from tests.integration.conftest import console_script, elastic_recipe, run

pytestmark = pytest.mark.e2e

DJ_PROCESS = console_script("dj-process")


def _submit(tmp_path, dataset, write_recipe, *ops):
    recipe = elastic_recipe(dataset, tmp_path, process=[{"whitespace_normalization_mapper": None}, *ops])
    result = run([DJ_PROCESS, "--config", str(write_recipe(**recipe))], cwd=tmp_path)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("dj-process: error:"), result.stderr[-2000:]
    assert not (tmp_path / "job").exists() and not (tmp_path / "out").exists()
    return result, error


def test_ray_only_keys_are_named_in_one_warning_line_and_a_bad_value_is_refused(tmp_path, dataset, write_recipe):
    result, error = _submit(
        tmp_path,
        dataset,
        write_recipe,
        {"ray_bts_minhash_deduplicator": {"union_threshold": 64, "merge_batch_size": 10, "window_size": 4}},
        {"document_minhash_deduplicator": {"jaccard_threshold": 1.5}},
    )
    said = [line for line in (result.stdout + result.stderr).splitlines() if "Ray-only" in line]
    assert len(said) == 1, said
    assert "WARNING" in said[0] and "process[1] ray_bts_minhash_deduplicator" in said[0]
    assert said[0].endswith("ignored: merge_batch_size, union_threshold"), said[0]
    assert "process[2] document_minhash_deduplicator.jaccard_threshold" in error and "1.5" in error


# One refusal end to end in the default tier; the others there at the check (tests/integration/test_dedup_check.py),
# and end to end in the extended tier (each is a dj-process start).
EXTENDED = pytest.mark.extended


@pytest.mark.parametrize(
    ("op", "named", "alternative"),
    [
        ({"ray_bts_minhash_cpp_deduplicator": None}, "process[1] ray_bts_minhash_cpp_deduplicator", "ray_bts_minhash"),
        pytest.param(
            {"ray_bts_minhash_deduplicator": {"accelerator": "cuda", "tokenization": "character"}},
            "process[1] ray_bts_minhash_deduplicator.accelerator",
            "cpu",
            marks=EXTENDED,
        ),
        pytest.param(
            {"document_minhash_deduplicator": {"tokenization": "sentencepiece"}},
            "process[1] document_minhash_deduplicator",
            "tokenizer_model",
            marks=EXTENDED,
        ),
        pytest.param(
            {"ray_image_deduplicator": None},
            "process[1] ray_image_deduplicator",
            "separate Data-Juicer job",
            marks=EXTENDED,
        ),
    ],
)
def test_refused_deduplicators_exit_2_naming_the_entry_and_what_to_do(tmp_path, dataset, write_recipe, op, named,
                                                                       alternative):  # fmt: skip
    _, error = _submit(tmp_path, dataset, write_recipe, op)
    assert named in error and alternative in error, error
