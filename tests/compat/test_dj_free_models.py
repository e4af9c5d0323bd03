"""compat.dj_free_models, no silent torch install: free_models() touches torch only when it is installed."""

from __future__ import annotations

import types

from data_juicer_elastic import compat
from data_juicer_elastic.compat import dj_free_models


class InstallingLoader:
    """Stands for Data-Juicer's LazyLoader("torch"): any attribute access would pip-install torch."""

    def __init__(self):
        self.touched = False

    def __getattr__(self, name):
        self.touched = True
        raise AssertionError("torch was touched: Data-Juicer would install it now")


def _fake_base_op():
    model_utils = types.ModuleType("fake_model_utils")
    model_utils.MODEL_ZOO = {"a-model": object()}
    model_utils.torch = InstallingLoader()

    def free_models(clear_model_zoo=True):
        for _ in model_utils.MODEL_ZOO:
            pass
        if clear_model_zoo:
            model_utils.MODEL_ZOO.clear()
        model_utils.torch.cuda.empty_cache()

    free_models.__module__ = "fake_model_utils"
    base_op = types.ModuleType("fake_base_op")
    base_op.free_models = free_models
    return base_op, model_utils


def test_without_torch_the_model_cache_is_cleared_and_torch_never_touched(monkeypatch):
    base_op, model_utils = _fake_base_op()
    monkeypatch.setitem(__import__("sys").modules, "fake_model_utils", model_utils)
    monkeypatch.setattr(dj_free_models, "torch_installed", lambda: False)
    assert dj_free_models.install(base_op)
    base_op.free_models()
    assert model_utils.MODEL_ZOO == {} and not model_utils.torch.touched


def test_with_torch_the_original_runs(monkeypatch):
    base_op, model_utils = _fake_base_op()
    monkeypatch.setitem(__import__("sys").modules, "fake_model_utils", model_utils)
    monkeypatch.setattr(dj_free_models, "torch_installed", lambda: True)
    dj_free_models.install(base_op)
    dj_free_models.install(base_op)  # idempotent: wrapped once
    try:
        base_op.free_models()
    except AssertionError:
        pass
    assert model_utils.torch.touched, "the original free_models ran"


def test_data_juicer_operators_call_the_guarded_free_models():
    from data_juicer.ops import base_op

    assert getattr(base_op.free_models, compat.ORIGINAL, None) is not None


def test_self_check():
    assert "free_models" in dj_free_models.self_check()
