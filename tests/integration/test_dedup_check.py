"""The deduplicators an elastic recipe may hold (integration.dedup_check): accepted anywhere between
Mappers and Filters, Ray versions mapped onto the default operator's arguments from the classes'
signatures, the rest refused naming what to use, and a config Data-Juicer would refuse refused up front."""

from __future__ import annotations

import importlib.util
import inspect

import pytest
from data_juicer.ops import OPERATORS
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.dedup.stages import ACCEPTED
from data_juicer_elastic.errors import RecipeError
from data_juicer_elastic.integration import dedup_check
from data_juicer_elastic.integration.dedup_check import default_args, ray_only_keys, recipe_stages
from data_juicer_elastic.integration.recipe import check_shard_safe

MAPPER = {"whitespace_normalization_mapper": {}}
FILTER = {"text_length_filter": {"min_len": 3}}
HAS_SIMHASH = importlib.util.find_spec("simhash") is not None


def recipe(*ops) -> dict:
    return {"executor_type": "ray", "process": [MAPPER, *ops]}


def _init_names(name: str) -> set[str]:
    """The oracle: every named ``__init__`` argument of the class and its deduplicator bases."""
    names = set()
    for klass in OPERATORS.modules[name].__mro__:
        if klass.__module__.startswith("data_juicer.ops.deduplicator") and "__init__" in klass.__dict__:
            names |= set(list(inspect.signature(klass.__init__).parameters)[1:]) - {"args", "kwargs"}
    return names


@pytest.mark.parametrize("name", sorted(set(ACCEPTED) - {"document_simhash_deduplicator"}))
def test_each_accepted_deduplicator_passes_with_its_defaults(name):
    assert check_shard_safe(recipe({name: None}, FILTER)) == []


@pytest.mark.skipif(not HAS_SIMHASH, reason="simhash-pybind is not installed here")
def test_simhash_passes_where_simhash_pybind_is_installed_and_a_distance_simhash_refuses_is_refused():
    assert check_shard_safe(recipe({"document_simhash_deduplicator": {"hamming_distance": 3}})) == []
    op = {"document_simhash_deduplicator": {"num_blocks": 4, "hamming_distance": 4}}
    with pytest.raises(RecipeError) as info:
        check_shard_safe(recipe(op))
    assert info.value.where == "process[1] document_simhash_deduplicator"
    assert "must be greater than different_bits" in info.value.message
    # the oracle: Data-Juicer's own process refuses it, at the end of a default run's hashing
    import datasets

    simhash_op = OPERATORS.modules["document_simhash_deduplicator"](num_blocks=4, hamming_distance=4)
    rows = [simhash_op.compute_hash({"text": "a b c d e f g h"}), simhash_op.compute_hash({"text": "b c d e f g h"})]
    with pytest.raises(ValueError, match="different_bits"):
        simhash_op.process(datasets.Dataset.from_list(rows))


def test_simhash_without_simhash_pybind_is_refused_instead_of_installed_at_run_time(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "simhash" else real(name, *a))
    with pytest.raises(RecipeError) as info:
        check_shard_safe(recipe({"document_simhash_deduplicator": None}))
    assert info.value.where == "process[1] document_simhash_deduplicator"
    assert "simhash-pybind is not installed" in info.value.message and "doctor" in info.value.hint


def test_any_number_of_deduplicators_anywhere_between_mappers_and_filters():
    process = recipe(
        {"document_deduplicator": {"lowercase": True}},
        FILTER,
        {"document_minhash_deduplicator": {"window_size": 3}},
        MAPPER,
        {"document_deduplicator": None},
    )
    assert check_shard_safe(process) == []
    stages = recipe_stages(process)
    assert [(s.number, s.position, s.op_name) for s in stages] == [
        (1, 1, "document_deduplicator"),
        (2, 3, "document_minhash_deduplicator"),
        (3, 5, "document_deduplicator"),
    ]
    assert [s.args for s in stages] == [{"lowercase": True}, {"window_size": 3}, {}]


@pytest.mark.parametrize(
    ("name", "runs_as"),
    [
        ("ray_document_deduplicator", "document_deduplicator"),
        ("ray_bts_minhash_deduplicator", "document_minhash_deduplicator"),
    ],
)
def test_a_ray_version_runs_as_the_default_operator_its_ray_only_keys_dropped_with_one_warning(name, runs_as, caplog):
    ray_only = _init_names(name) - _init_names(runs_as)
    assert ray_only and ray_only_keys(name) == ray_only
    args = {key: "x" for key in sorted(ray_only)} | {"lowercase": True, "text_key": "content"}
    warnings = check_shard_safe(recipe(FILTER, {name: args}))
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith(f"process[2] {name}: runs as {runs_as}")
    assert all(key in warnings[0] for key in ray_only)
    (stage,) = recipe_stages(recipe(FILTER, {name: args}))
    assert (stage.op_name, stage.runs_as, stage.position) == (name, runs_as, 2)
    assert stage.args == {"lowercase": True, "text_key": "content"}
    assert stage.op_config() == {runs_as: stage.args}
    # without Ray-only keys: no warning
    assert check_shard_safe(recipe({name: {"lowercase": True}})) == []


def test_a_shared_argument_whose_ray_default_differs_is_passed_explicitly(monkeypatch):
    class DefaultOp:
        def __init__(self, window: int = 5, lowercase: bool = True, *args, **kwargs):
            pass

    class RayOp:
        def __init__(self, window: int = 9, lowercase: bool = True, actors: int = 4, *args, **kwargs):
            pass

    classes = {"fake_ray_dedup": RayOp, "fake_dedup": DefaultOp}
    monkeypatch.setitem(ACCEPTED, "fake_ray_dedup", ("fake_dedup", ACCEPTED["document_deduplicator"][1]))
    monkeypatch.setattr(dedup_check, "_op_class", classes.__getitem__)
    assert default_args("fake_ray_dedup", {"actors": 2}) == {"window": 9}
    assert default_args("fake_ray_dedup", {"window": 3, "lowercase": False}) == {"window": 3, "lowercase": False}
    assert ray_only_keys("fake_ray_dedup") == {"actors"}


@pytest.mark.parametrize(
    ("op", "where", "said"),
    [
        ({"ray_bts_minhash_cpp_deduplicator": None}, "process[1] ray_bts_minhash_cpp_deduplicator", "C++"),
        ({"document_minhash_deduplicator_with_uid": None}, "process[1] document_minhash_deduplicator_with_uid", "uid"),
        ({"ray_bts_minhash_deduplicator_with_uid": None}, "process[1] ray_bts_minhash_deduplicator_with_uid", "uid"),
        ({"image_deduplicator": None}, "process[1] image_deduplicator", "not one of"),
        ({"ray_image_deduplicator": None}, "process[1] ray_image_deduplicator", "not one of"),  # a Filter subclass
        ({"ray_video_deduplicator": None}, "process[1] ray_video_deduplicator", "not one of"),
        ({"video_deduplicator": None}, "process[1] video_deduplicator", "not one of"),
        ({"document_line_deduplicator": None}, "process[1] document_line_deduplicator", "not one of"),
    ],
)
def test_other_deduplicators_are_refused_naming_what_to_use(op, where, said):
    with pytest.raises(RecipeError) as info:
        check_shard_safe(recipe(op))
    assert info.value.where == where and said in info.value.message
    assert "minhash_deduplicator" in info.value.hint or "separate Data-Juicer job" in info.value.hint


def test_the_gpu_minhash_is_refused_naming_the_cpu_path():
    op = {"ray_bts_minhash_deduplicator": {"accelerator": "cuda", "tokenization": "character"}}
    with pytest.raises(RecipeError) as info:
        check_shard_safe(recipe(op))
    assert info.value.where == "process[1] ray_bts_minhash_deduplicator.accelerator"
    assert "GPU MinHash" in info.value.message and "cpu" in info.value.hint
    # the default operators have no GPU path: accelerator changes nothing they compute
    assert check_shard_safe(recipe({"document_deduplicator": {"accelerator": "cuda"}})) == []


@pytest.mark.parametrize(
    ("op", "where", "said"),
    [
        ({"document_minhash_deduplicator": {"jaccard_threshold": 2}}, ".jaccard_threshold", "less than or equal to 1"),
        ({"document_minhash_deduplicator": {"window_size": 0}}, ".window_size", "greater than 0"),
        ({"document_minhash_deduplicator": {"num_bands": "many"}}, ".num_bands", "integer"),
        ({"ray_bts_minhash_deduplicator": {"jaccard_threshold": -1}}, ".jaccard_threshold", "greater than or equal"),
        ({"document_deduplicator": {"lowercase": "sometimes"}}, ".lowercase", "boolean"),
        ({"document_minhash_deduplicator": {"tokenization": "words"}}, "", "Unimplemented tokenization method"),
        ({"document_minhash_deduplicator": {"tokenization": "sentencepiece"}}, "", "'tokenizer_model' is required"),
        ({"document_minhash_deduplicator": {"ignore_pattern": "("}}, "", "Data-Juicer refuses"),
    ],
)
def test_a_config_data_juicer_would_refuse_is_refused_naming_the_entry(op, where, said):
    ((name, _),) = op.items()
    with pytest.raises(RecipeError) as info:
        check_shard_safe(recipe(FILTER, op))
    assert info.value.where == f"process[2] {name}{where}"
    assert said in info.value.message


def test_what_is_refused_here_data_juicer_refuses_too():
    """The oracle for the refusals above that come from Data-Juicer's build: its own operator raises."""
    minhash = OPERATORS.modules["document_minhash_deduplicator"]
    with pytest.raises(NotImplementedError):
        minhash(tokenization="words").compute_hash({"text": "a b c d e f g"})
    with pytest.raises(ValueError, match="tokenizer_model"):
        minhash(tokenization="sentencepiece")


def test_sentencepiece_with_a_model_path_is_accepted_without_loading_the_model():
    op = {"document_minhash_deduplicator": {"tokenization": "sentencepiece", "tokenizer_model": "/no/such.model"}}
    assert check_shard_safe(recipe(op)) == []


@given(data=st.data())
@settings(max_examples=60, deadline=None)
@pytest.mark.parametrize("name", ["ray_document_deduplicator", "ray_bts_minhash_deduplicator"])
def test_a_ray_versions_args_become_the_default_operators_whatever_subset_is_set(name, data):
    """Any subset of the Ray class's arguments (and shared operator keys): the Ray-only ones dropped, every
    other one kept with its value; what is left is a keyword the default operator takes."""
    runs_as, _ = ACCEPTED[name]
    own = sorted(_init_names(name)) + ["text_key", "accelerator", "num_proc"]
    chosen = data.draw(st.lists(st.sampled_from(own), unique=True))
    args = {key: data.draw(st.integers() | st.text(max_size=3) | st.booleans()) for key in chosen}
    mapped = default_args(name, args)
    assert set(mapped) == set(args) - ray_only_keys(name)
    assert all(mapped[key] == args[key] for key in mapped)
    assert set(mapped) <= _init_names(runs_as) | {"text_key", "accelerator", "num_proc"}
