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
        raise RecipeError("a Selector needs the whole dataset", where="process[1]")

    with pytest.raises(RecipeError, match="Selector"):
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


ELASTIC = {"executor_type": "elastic_sharded", "dataset_path": "in.jsonl", "elastic": {"job_dir": "job"}}


@pytest.fixture
def plain_env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for key in [k for k in __import__("os").environ if k.startswith("DJ_PROCESS_")]:
        monkeypatch.delenv(key)


@pytest.mark.parametrize(
    "text",
    [
        None,  # no such file
        b"executor_type: elastic_sharded\n\xff\xfe",  # not UTF-8
        "a: [b",  # not YAML
        "key: !include other.yaml",  # YAML this reader does not take
        "- a list",
        yaml.safe_dump({**ELASTIC, "executor_type": "ray"}),
        yaml.safe_dump({**ELASTIC, "elastic": "job"}),
        yaml.safe_dump({**ELASTIC, "elastic": {1: "job"}}),
        yaml.safe_dump({k: v for k, v in ELASTIC.items() if k != "dataset_path"}),
        yaml.safe_dump({**ELASTIC, "dataset_path": 5}),
        yaml.safe_dump({**ELASTIC, "elastic": {"job_dir": "job", "num_shard": 2}}),
        yaml.safe_dump({**ELASTIC, "elastic": {"job_dir": "job", "num_shards": "two"}}),
        yaml.safe_dump({**ELASTIC, "process": 5}),
        yaml.safe_dump({**ELASTIC, "process": [{"a_mapper": ["not", "a", "mapping"]}]}),
        yaml.safe_dump({**ELASTIC, "process": [{"a_mapper": {"index_key": "i"}, "b_mapper": None}]}),
        yaml.safe_dump({**ELASTIC, "process": [{"a_mapper": {"index_key": "i"}}, {"b_mapper": {"index_key": "j"}}]}),
    ],
)
def test_early_request_leaves_what_it_cannot_read_to_the_parse(tmp_path, plain_env, text):
    config = tmp_path / "r.yaml"
    if isinstance(text, bytes):
        config.write_bytes(text)
    elif text is not None:
        config.write_text(text)
    assert early_request(str(config), {}) is None
    assert early_request(str(tmp_path), {}) is None  # a directory


@pytest.mark.parametrize("helper", ["preparation._request", "preparation.index_key"])
def test_early_request_raises_a_bug_instead_of_hiding_it(tmp_path, plain_env, monkeypatch, helper):
    config = tmp_path / "r.yaml"
    config.write_text(yaml.safe_dump(ELASTIC))
    assert early_request(str(config), {}) is not None

    def broken(*args, **kwargs):
        raise TypeError("a bug")

    monkeypatch.setattr(f"data_juicer_elastic.{helper}", broken)
    with pytest.raises(TypeError, match="a bug"):
        early_request(str(config), {})


def _yaml_values():
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers() | st.text("abcj_/ .:-", max_size=8)
    return st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(scalars, inner, max_size=3)
    )


def test_early_request_guesses_or_gives_up_on_any_recipe_shape(tmp_path_factory, plain_env):
    """Whatever a YAML recipe holds at the keys the early read looks at, it returns a request or None."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    values = _yaml_values()
    path = st.text("abcj_/.-", min_size=1, max_size=8).filter(str.strip)
    known = st.sampled_from(["num_shards", "shard_codec", "copy_shards", "nodes", "require_all_nodes", 1])
    block = st.fixed_dictionaries({"job_dir": path | values}, optional={"num_shards": st.integers(1, 4) | values})
    recipes = st.fixed_dictionaries(
        {"executor_type": st.just("elastic_sharded")},
        optional={
            "dataset_path": path | values,
            "elastic": block | values | st.dictionaries(known, values, max_size=3).map(lambda b: {"job_dir": "j", **b}),
            "process": st.lists(st.dictionaries(st.text("abc_", min_size=1), values, max_size=2), max_size=3) | values,
            "image_key": values,
        },
    )

    @settings(max_examples=150, deadline=None)
    @given(recipes)
    def check(recipe):
        config = tmp_path_factory.mktemp("early") / "r.yaml"
        config.write_text(yaml.safe_dump(recipe))
        early_request(str(config), {})

    check()


def test_planning_a_job_again_says_whether_its_data_was_scanned(tmp_path, monkeypatch):
    """`dj-elastic prepare` (plan only) on a job planned before: '(the workers scan the data)' only
    while they have yet to; a job whose scans ended says it was scanned before."""
    import json

    from data_juicer_elastic import preparation
    from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job

    said: list[str] = []
    monkeypatch.setattr(preparation, "say", said.append)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(10)))
    request = PrepareRequest(job_dir=tmp_path / "job", dataset_path=data, num_shards=2, recipe={}, stage_identities=[])
    preparation._prepare(request)
    preparation._prepare(request)
    prepare_job(request)  # the scans, as the workers run them
    preparation._prepare(request)
    assert [line.rsplit("(", 1)[1] for line in said] == [
        "the workers scan the data)",
        "the workers scan the data)",
        "scanned before)",
    ], said
    assert said[1].startswith("reusing the planned job")
