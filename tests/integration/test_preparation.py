"""dj-elastic prepare: planning runs while Data-Juicer parses the recipe; only the parsed request is published."""

from __future__ import annotations

import threading

import pytest
import yaml

from data_juicer_elastic.errors import RecipeError
from data_juicer_elastic.jobdir.manifest import load_manifest, load_plan
from data_juicer_elastic.preparation import early_request, prepare_overlapped
from tests.jobdir.conftest import make_rows, request, write_rows

RECIPE = {"process": [{"text_length_filter": {"min_len": 3}}], "executor_type": "ray"}


def test_planning_runs_while_the_recipe_is_parsed_and_publishes_the_parsed_recipe(tmp_path, monkeypatch):
    from data_juicer_elastic.shards import prepare

    data = write_rows(tmp_path / "in.jsonl", make_rows(40))
    early = request(tmp_path / "job", data, 4, recipe={}, stage_identities=[])
    planning = threading.Event()
    real_plan = prepare.plan_shards

    def plan_shards(*args):
        planning.set()
        return real_plan(*args)

    monkeypatch.setattr(prepare, "plan_shards", plan_shards)

    def parse():
        assert planning.wait(30), "the inputs are listed and cut before the parse returns"
        return request(tmp_path / "job", data, 4, recipe=RECIPE, stage_identities=["stage-0000:f"])

    outcome = prepare_overlapped(early, parse)
    plan = load_plan(tmp_path / "job")
    assert outcome.created and plan.recipe == RECIPE and plan.stage_identities == ["stage-0000:f"]
    assert plan.num_shards == 4 and not (tmp_path / "job" / "manifest.json").exists(), "the workers scan"


def test_a_wrong_early_guess_prepares_again_from_the_parsed_request(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(40))
    early = request(tmp_path / "job", data, 3, recipe={}, stage_identities=[])
    outcome = prepare_overlapped(early, lambda: request(tmp_path / "job", data, 5, recipe=RECIPE))
    assert outcome.created and load_plan(tmp_path / "job").num_shards == 5


def test_prepare_with_scan_reads_every_row_here(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(40))
    early = request(tmp_path / "job", data, 4, recipe={}, stage_identities=[])
    outcome = prepare_overlapped(early, lambda: request(tmp_path / "job", data, 4, recipe=RECIPE), scan=True)
    assert outcome.created and load_manifest(tmp_path / "job").total_rows == 40


def test_a_refused_recipe_stops_the_pass_and_nothing_is_published(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(40))
    early = request(tmp_path / "job", data, 4, recipe={}, stage_identities=[])

    def parse():
        raise RecipeError("a Deduplicator needs the whole dataset", where="process[1]")

    with pytest.raises(RecipeError, match="Deduplicator"):
        prepare_overlapped(early, parse)
    assert not (tmp_path / "job" / "plan.json").exists() and not (tmp_path / "job" / "manifest.json").exists()


def test_early_request_reads_the_input_fields_from_the_yaml_only(tmp_path, monkeypatch):
    config = tmp_path / "r.yaml"
    recipe = {
        "executor_type": "elastic_sharded",
        "dataset_path": "data/in.jsonl",
        "image_key": "pictures",
        "elastic": {"job_dir": "jobs/j", "num_shards": 6, "shard_codec": "zstd"},
        "process": [{"demo_mapper": {"index_key": "row"}}],
    }
    config.write_text(yaml.safe_dump(recipe))
    monkeypatch.chdir(tmp_path)
    for key in [k for k in __import__("os").environ if k.startswith("DJ_PROCESS_")]:
        monkeypatch.delenv(key)
    early = early_request(str(config), {"num_shards": 7, "dataset_path": None})
    assert early.job_dir == tmp_path / "jobs" / "j" and early.dataset_path == tmp_path / "data" / "in.jsonl"
    assert (early.num_shards, early.shard_codec, early.index_key) == (7, "zstd", "row")
    assert early.media_keys["image_key"] == "pictures"
    monkeypatch.setenv("DJ_PROCESS_NP", "2")  # Data-Juicer's parser reads these too: no guess
    assert early_request(str(config), {}) is None
    config.write_text("not: [valid")
    monkeypatch.delenv("DJ_PROCESS_NP")
    assert early_request(str(config), {}) is None
