"""What a new user meets in the first hour, through the real `dj-process` and `dj-elastic`: a recipe
that forgot `executor_type`, a mistyped `elastic.*` key, and refused runs that leave nothing behind."""

from __future__ import annotations

import json

import pytest

from data_juicer_elastic.integration.config_block import hint_unknown_keys
from data_juicer_elastic.settings import ElasticSettings, closest_key
from tests.integration.conftest import console_script, elastic_recipe, run

pytestmark = pytest.mark.e2e

DJ_PROCESS = console_script("dj-process")
DJ_ELASTIC = console_script("dj-elastic")
FIX = "add `executor_type: elastic_sharded`"


def _without_executor_type(dataset, tmp_path) -> dict:
    recipe = elastic_recipe(dataset, tmp_path)
    del recipe["executor_type"]
    return recipe


def test_an_elastic_block_without_executor_type_warns_before_the_table_and_at_the_end(tmp_path, dataset, write_recipe):
    """The warning is where it is seen: before Data-Juicer's ~300-line configuration table, and again
    among the last lines once the default executor has run."""
    recipe = write_recipe(**_without_executor_type(dataset, tmp_path))
    result = run([DJ_PROCESS, "--config", str(recipe)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    said = [number for number, line in enumerate(lines) if FIX in line]
    assert len(said) == 2 and FIX not in result.stdout, result.stderr[-3000:]
    table = next(number for number, line in enumerate(lines) if "╒" in line)  # Data-Juicer's table starts
    assert said[0] < table, "before the configuration table"
    assert said[1] >= len(lines) - 2, lines[-5:]  # at the end of the run
    for number in said:
        assert "WARNING" in lines[number] and "elastic.job_dir" in lines[number]
        assert "ignores the elastic: block" in lines[number]
    # Data-Juicer's default executor ran it, exactly as without the plugin: its export, no job dir
    rows = [json.loads(line) for line in (tmp_path / "out" / "merged.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and not (tmp_path / "job").exists()


def test_choosing_the_executor_on_the_command_line_is_deliberate_no_warning(tmp_path, dataset, write_recipe):
    recipe = write_recipe(**elastic_recipe(dataset, tmp_path))
    result = run([DJ_PROCESS, "--config", str(recipe), "--executor_type", "default"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert FIX not in result.stdout + result.stderr


def test_dj_elastic_prepare_refuses_a_recipe_without_executor_type(tmp_path, dataset, write_recipe):
    recipe = write_recipe(**_without_executor_type(dataset, tmp_path))
    result = run([DJ_ELASTIC, "prepare", "--config", str(recipe)], cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "executor_type is 'default', not elastic_sharded" in error and FIX in error and str(recipe) in error
    assert "event_log_file" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "job").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("command", "elastic", "cli", "meant"),
    [
        ("dj-process", {"num_shard": 2}, [], "num_shards"),
        ("dj-elastic prepare", {"num_shard": 2}, [], "num_shards"),
        ("dj-process", {"num_shards": 2}, ["--elastic.numshards", "2"], "num_shards"),
        ("dj-process", {"num_shards": 2, "ray_adress": "local"}, [], "ray_address"),
    ],
)
def test_a_mistyped_elastic_key_is_refused_with_did_you_mean(tmp_path, dataset, write_recipe, command, elastic, cli,
                                                             meant):  # fmt: skip
    recipe = write_recipe(**elastic_recipe(dataset, tmp_path, elastic={"job_dir": str(tmp_path / "job"), **elastic}))
    program = [DJ_PROCESS] if command == "dj-process" else [DJ_ELASTIC, "prepare"]
    result = run([*program, "--config", str(recipe), *cli], cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"did you mean elastic.{meant}?" in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "job").exists() and not (tmp_path / "out").exists()


def test_every_key_with_one_character_dropped_or_doubled_is_recognised():
    """The hint's rule (difflib) on every key: a dropped or a doubled character finds the key."""
    for name in ElasticSettings.field_names():
        for k in range(len(name)):
            for typo in (name[:k] + name[k + 1 :], name[:k] + name[k] + name[k:]):
                if typo and typo not in ElasticSettings.field_names():
                    assert closest_key(typo) == name, (typo, closest_key(typo))
    message = "Option 'elastic.num_shard' is not accepted"
    assert hint_unknown_keys(message).startswith(message + ": did you mean elastic.num_shards?")
    assert hint_unknown_keys("Option 'elastic.zzz' is not accepted") == "Option 'elastic.zzz' is not accepted"
    assert hint_unknown_keys("Option 'np' is not accepted") == "Option 'np' is not accepted"


REFUSED_RUNS = {
    "missing input": {"dataset_path": "no-such-file.jsonl"},
    "more shards than rows": {"elastic": {"num_shards": 50}},
    "a deduplicator that hashes differently": {"process": [{"ray_bts_minhash_cpp_deduplicator": None}]},
    "a malformed row": {"dataset_path": "bad.jsonl"},
}


@pytest.mark.parametrize("case", sorted(REFUSED_RUNS))
def test_a_refused_run_leaves_no_job_directory_and_nothing_beside_the_export(tmp_path, dataset, write_recipe, case):
    (tmp_path / "bad.jsonl").write_text('{"id": 0, "text": "hello there"}\n{"id": 1, "text": \n{"id": 2}\n')
    recipe = elastic_recipe(dataset, tmp_path)
    recipe["elastic"]["job_dir"] = str(tmp_path / "out" / "job")  # beside the export, as in the demo
    change = dict(REFUSED_RUNS[case])
    recipe["elastic"].update(change.pop("elastic", {}))
    recipe.update({k: str(tmp_path / v) if k == "dataset_path" else v for k, v in change.items()})
    before = set(tmp_path.iterdir())
    result = run([DJ_PROCESS, "--config", str(write_recipe(**recipe))], cwd=tmp_path)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith("dj-process: error:"), result.stderr[-2000:]
    added = sorted(p.name for p in set(tmp_path.iterdir()) - before)
    assert added == ["recipe.yaml"], f"left behind: {added} (no job, export or work dir, no folder above them)"


def test_a_refused_run_never_removes_a_job_directory_or_folder_that_was_there(tmp_path, dataset, write_recipe):
    (tmp_path / "job").mkdir()
    (tmp_path / "kept").mkdir()
    for job_dir in (tmp_path / "job", tmp_path / "kept" / "new" / "job"):
        recipe = elastic_recipe(dataset, tmp_path, process=[{"document_line_deduplicator": None}])
        recipe["elastic"]["job_dir"] = str(job_dir)
        result = run([DJ_PROCESS, "--config", str(write_recipe(**recipe))], cwd=tmp_path)
        assert result.returncode == 2, result.stderr[-3000:]
    assert (tmp_path / "job").is_dir() and (tmp_path / "kept").is_dir()
    assert not (tmp_path / "kept" / "new").exists(), "the folders this run created went with its job directory"
