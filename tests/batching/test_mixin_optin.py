"""The mixin on real Data-Juicer Mappers, the recipe opt-in, and its configuration checks."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

pytest.importorskip("data_juicer")

from data_juicer.ops.base_op import OPERATORS, Filter, Mapper  # noqa: E402

from data_juicer_elastic.batching import AdaptiveBatchingMixin, mixin  # noqa: E402
from data_juicer_elastic.batching.demo import NAME as DEMO  # noqa: E402
from data_juicer_elastic.errors import ConfigError, MicroBatchOOMError  # noqa: E402

TEXTS = [f"row {i} " + "x" * (i % 7) * 10 for i in range(40)]


class OwnMapper(AdaptiveBatchingMixin, Mapper):
    """Class-level opt-in: the mixin is in the bases."""

    _batched_op = True

    def __init__(self, capacity: int = 5, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.capacity = capacity

    def process_batched(self, samples):
        if len(samples["text"]) > self.capacity:
            raise RuntimeError("CUDA out of memory (test)")
        samples["upper"] = [t.upper() for t in samples["text"]]
        return samples


class PlainFilter(Filter):
    def compute_stats_single(self, sample):
        return sample

    def process_single(self, sample):
        return True


def demo(**kwargs):
    kwargs.setdefault("torch_errors", False)
    return OPERATORS.modules[DEMO](**kwargs)


def test_recipe_opt_in_applies_the_mixin_and_keeps_the_operator():
    op = demo(capacity=300, batch_size=32, adaptive_batching=True, suffix="#", num_cpus=1)
    assert isinstance(op, AdaptiveBatchingMixin) and type(op).__mro__[2] is OPERATORS.modules[DEMO]
    assert op._name == DEMO and op.batch_size == 32 and op.num_cpus == 1
    out = op.process({"text": list(TEXTS)})
    assert out["text"] == [t + "#" for t in TEXTS]
    assert out["demo_chars"] == [len(t) for t in TEXTS]
    stats = op.adaptive_batching_stats()
    assert next(iter(stats.values()))["ooms"] > 0


def test_without_opt_in_the_class_is_unchanged_and_ooms_fail():
    op = demo(capacity=300, batch_size=32)
    assert type(op) is OPERATORS.modules[DEMO] and not isinstance(op, AdaptiveBatchingMixin)
    with pytest.raises(RuntimeError, match="out of memory"):
        op.process({"text": list(TEXTS)})


def test_arrow_input_through_process():
    op = demo(capacity=300, batch_size=40, adaptive_batching=True)
    out = op.process(pa.table({"text": TEXTS, "id": list(range(40))}))
    assert out["id"] == list(range(40)) and out["demo_chars"] == [len(t) for t in TEXTS]


def test_class_level_opt_in_and_recipe_false_override():
    op = OwnMapper(batch_size=16)
    assert op.process({"text": TEXTS[:16]})["upper"] == [t.upper() for t in TEXTS[:16]]
    off = OwnMapper(batch_size=16, adaptive_batching=False)
    assert not off._adaptive_enabled
    with pytest.raises(RuntimeError, match="out of memory"):
        off.process({"text": TEXTS[:16]})


def test_unrecoverable_oom_is_not_swallowed_by_skip_op_error():
    from data_juicer_elastic.batching.policy import PolicyConfig

    class Impatient(OwnMapper):
        adaptive_batching_policy = PolicyConfig(floor_backoff_secs=0.0)

    op = Impatient(capacity=0, batch_size=4, skip_op_error=True)
    with pytest.raises(MicroBatchOOMError, match="out of memory with 1 row"):
        op.process({"text": TEXTS[:4]})


def test_ordinary_error_with_skip_op_error_keeps_other_slices():
    class Picky(AdaptiveBatchingMixin, Mapper):
        _batched_op = True

        def process_batched(self, samples):
            if len(samples["text"]) > 4:
                raise MemoryError()
            if any(t.startswith("row 5 ") for t in samples["text"]):
                raise ValueError("bad row")
            return samples

    out = Picky(batch_size=16, skip_op_error=True).process({"text": TEXTS[:16]})
    dropped = [t for t in TEXTS[:16] if t not in out["text"]]
    assert TEXTS[5] in dropped and len(dropped) <= 4  # only the micro-batch holding row 5 is dropped
    assert out["text"] == [t for t in TEXTS[:16] if t not in dropped]


def test_adaptive_class_pickles_by_reference():
    cls = mixin.adaptive_class(OPERATORS.modules[DEMO])
    assert pickle.loads(pickle.dumps(cls)) is cls
    op = demo(capacity=300, batch_size=8, adaptive_batching=True)
    clone = pickle.loads(pickle.dumps(op))
    assert type(clone) is type(op) and clone.process({"text": TEXTS[:8]})["demo_chars"] == [len(t) for t in TEXTS[:8]]
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    assert cloudpickle.loads(cloudpickle.dumps(cls)) is cls
    # a fresh process resolves the name through the module's __getattr__
    name = cls.__name__
    mixin._classes.pop(OPERATORS.modules[DEMO])
    del mixin.__dict__[name]
    again = getattr(mixin, name)
    assert again.__name__ == name and again._adaptive_base is OPERATORS.modules[DEMO]


def test_refusals_at_construction():
    with pytest.raises(ConfigError, match="Mappers only"):
        mixin.resolve(PlainFilter, True)
    with pytest.raises(ConfigError, match="at most one GPU"):
        demo(batch_size=4, adaptive_batching=True, num_gpus=2)


def cfg(process, **extra):
    from jsonargparse import Namespace

    return Namespace(process=process, **extra)


def test_check_config_accepts_and_refuses():
    ok = [{DEMO: {"adaptive_batching": True, "batch_size": 8}}, {"text_length_filter": {"min_len": 1}}]
    mixin.check_config(cfg(ok))
    with pytest.raises(ConfigError, match="wrap them a second time"):
        mixin.check_config(cfg(ok, elastic_juicer_adaptive_batching=True))
    with pytest.raises(ConfigError, match="fused"):
        mixin.check_config(cfg(ok, op_fusion=True))
    with pytest.raises(ConfigError, match="text_length_filter is a Filter"):
        mixin.check_config(cfg([{"text_length_filter": {"adaptive_batching": True}}]))
    with pytest.raises(ConfigError, match="batched Mapper"):
        mixin.check_config(cfg([{"audio_add_gaussian_noise_mapper": {"adaptive_batching": True}}]))
    with pytest.raises(ConfigError, match="num_gpus=2"):
        mixin.check_config(cfg([{DEMO: {"adaptive_batching": True, "num_gpus": 2}}]))
    # no opt-in: Data-Juicer's own switch is none of our business
    mixin.check_config(cfg([{DEMO: {}}], elastic_juicer_adaptive_batching=True))


def test_env_switch_off_leaves_adaptive_batching_to_data_juicer(monkeypatch):
    monkeypatch.setenv(mixin.ENV_SWITCH, "off")
    op = demo(batch_size=4, adaptive_batching=True)
    assert type(op) is OPERATORS.modules[DEMO]
    mixin.check_config(cfg([{DEMO: {"adaptive_batching": True}}], elastic_juicer_adaptive_batching=True))


def test_metaclass_hook_is_installed_by_the_plugin():
    import data_juicer.ops.base_op as base_op

    from data_juicer_elastic.compat import dj_ops_internals
    from data_juicer_elastic.integration import patch_records

    assert dj_ops_internals.metaclass_hook_installed(base_op)
    assert patch_records.RECORDS[patch_records.OP_METACLASS].state == "applied"


@OPERATORS.register_module("elastic_test_own_costs_mapper")
class OwnCostsMapper(Mapper):
    """A registered Mapper without the mixin that says how its micro-batches cost and that they must not
    be sorted: the recipe opt-in must keep that.  Memory is `weight` padded to the heaviest row of a call;
    over `capacity` it runs out."""

    _batched_op = True
    adaptive_batching_cost = "padded_text"  # rows x the heaviest row (the mixin's default sums)
    adaptive_batching_sort = False
    costs_asked = 0

    def __init__(self, capacity: float = 40.0, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.capacity = capacity

    def adaptive_row_costs(self, batch):
        OwnCostsMapper.costs_asked += 1  # on the registered class, not the built subclass
        return [float(w) for w in batch["weight"]]

    def process_batched(self, samples):
        if len(samples["weight"]) * max(samples["weight"]) > self.capacity:
            raise RuntimeError("CUDA out of memory (test)")
        samples["double"] = [2 * w for w in samples["weight"]]
        return samples


def test_recipe_opt_in_keeps_the_operators_own_cost_model_and_row_costs():
    from data_juicer.ops import load_ops

    from data_juicer_elastic.batching import runtime

    runtime.reset()
    name = "elastic_test_own_costs_mapper"
    (op,) = load_ops([{name: {"batch_size": 64, "adaptive_batching": True, "capacity": 40.0}}])
    assert isinstance(op, AdaptiveBatchingMixin) and type(op)._adaptive_base is OwnCostsMapper
    assert op.adaptive_batching_cost == "padded_text" and op.adaptive_batching_sort is False
    weights = [1.0] * 30 + [10.0] + [1.0] * 33  # the texts say nothing: only the operator's costs do
    before = OwnCostsMapper.costs_asked
    out = op.process({"weight": list(weights), "text": ["x"] * 64})
    assert out["double"] == [2 * w for w in weights]
    assert OwnCostsMapper.costs_asked > before  # the operator's adaptive_row_costs, not the mixin's
    stats = op.adaptive_batching_stats()
    assert set(stats) == {"padded_text"}  # the mixin's "auto" would have been "text"
    assert stats["padded_text"]["sorted_batches"] == 0  # its own adaptive_batching_sort = False
    trace = runtime._by_op[op]["padded_text"].policy.trace
    assert all(cost <= 40.0 for outcome, _, cost, _ in trace if outcome == "ok")
    # slices in input order, the one holding the heavy row costed as padded to it
    assert any(cost == 10.0 * rows for outcome, rows, cost, _ in trace)
    # a class that already has the mixin is used as it is
    assert mixin.adaptive_class(OwnMapper) is OwnMapper
