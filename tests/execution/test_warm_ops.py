"""The warm operator cache without Ray: keys, re-basing onto an attempt, rebuilds, the patch's scope."""

from __future__ import annotations

import pytest

from data_juicer_elastic.errors import IntegrationError
from data_juicer_elastic.execution import warm_ops
from data_juicer_elastic.execution.warm_ops import WarmOperators, op_key


def _process(work_dir: str, **args) -> list[dict]:
    return [{"fake_mapper": {"text_key": "text", "work_dir": work_dir, **args}}]


class _Op:
    def __init__(self, **kwargs):
        self.work_dir = kwargs.get("work_dir")
        self._init_args, self._init_kwargs = (), kwargs


def _builder(calls: list):
    def load_ops(process_list, op_env_manager=None):
        calls.append(process_list)
        return [_Op(**dict(item).popitem()[1]) for item in process_list]

    return load_ops


def test_key_ignores_work_dir_only():
    assert op_key(_process("/a/work")) == op_key(_process("/b/work"))
    assert op_key(_process("/a/work")) != op_key(_process("/a/work", min_len=3))


def test_cached_operators_are_rebased_onto_each_attempt():
    warm, calls = WarmOperators(), []
    first = warm.load(_builder(calls), _process("/attempt-1/work"))
    second = warm.load(_builder(calls), _process("/attempt-2/work"))
    assert len(calls) == 1 and warm.builds == 1
    assert second[0] is first[0]
    assert second[0].work_dir == "/attempt-2/work"
    assert second[0]._init_kwargs["work_dir"] == "/attempt-2/work"  # what actors are built with
    assert second[0]._op_cfg == _process("/attempt-2/work")[0]


def test_other_configs_and_a_drop_build_again():
    warm, calls = WarmOperators(), []
    warm.load(_builder(calls), _process("/w1"))
    warm.load(_builder(calls), _process("/w2", min_len=3))
    assert len(calls) == 2
    warm.drop("test")
    warm.load(_builder(calls), _process("/w3", min_len=3))
    assert len(calls) == 3


def test_the_resource_plan_is_made_once_for_the_cached_operators():
    warm, calls, plans = WarmOperators(), [], []
    ops = warm.load(_builder(calls), _process("/w1"))
    warm.plan(plans.append, ops)
    warm.plan(plans.append, warm.load(_builder(calls), _process("/w2")))  # the next shard: not sized again
    assert len(plans) == 1
    fused = [_Op(work_dir="/w2")]  # built per shard (op fusion): sized every time
    warm.plan(plans.append, fused)
    warm.plan(plans.append, fused)
    assert len(plans) == 3
    warm.drop("test")
    warm.plan(plans.append, warm.load(_builder(calls), _process("/w3")))
    assert len(plans) == 4


def test_an_env_manager_is_never_cached():
    warm, calls = WarmOperators(), []
    warm.load(_builder(calls), _process("/w1"), op_env_manager=object())
    warm.load(_builder(calls), _process("/w2"), op_env_manager=object())
    assert len(calls) == 2


def test_the_patch_is_scoped_and_restored():
    import data_juicer.core.executor.ray_executor as ray_executor
    import data_juicer.ops as dj_ops
    import data_juicer.utils.process_utils as process_utils

    before = (dj_ops.load_ops, ray_executor.load_ops, process_utils.calculate_ray_np)
    warm = WarmOperators()
    warm.actors.serving = _no_actors  # no Ray here: only the load_ops and planner half
    with warm.active():
        assert dj_ops.load_ops is not before[0] and ray_executor.load_ops.__wrapped__ is before[0]
        assert process_utils.calculate_ray_np.__wrapped__ is before[2]
    assert (dj_ops.load_ops, ray_executor.load_ops, process_utils.calculate_ray_np) == before


def test_switched_off_nothing_is_patched(monkeypatch):
    import data_juicer.ops as dj_ops

    monkeypatch.setenv(warm_ops.ENV_SWITCH, "0")
    before = dj_ops.load_ops
    with WarmOperators().active():
        assert dj_ops.load_ops is before


def test_a_moved_internal_is_an_integration_error(monkeypatch):
    import data_juicer.core.executor.ray_executor as ray_executor

    monkeypatch.delattr(ray_executor, "load_ops")
    with pytest.raises(IntegrationError, match="load_ops is missing"):
        with WarmOperators().active():
            pass


def test_batching_state_follows_the_attempts_work_dir(tmp_path):
    from data_juicer_elastic.batching import runtime

    class Op:
        batch_size = 8
        _name = "fake_mapper"
        work_dir = str(tmp_path / "attempt-1")

    op = Op()
    first = runtime.state_for(op, "rows")
    assert runtime.state_for(op, "rows") is first
    op.work_dir = str(tmp_path / "attempt-2")  # the warm operator now serves the next attempt
    second = runtime.state_for(op, "rows")
    assert second is not first and second.work_dir == op.work_dir


class _no_actors:  # noqa: N801 - stands in for WarmActors.serving, a context manager
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
