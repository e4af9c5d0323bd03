"""compat.dj_op_error_hooks: its self-check passes against the installed Data-Juicer, the plugin installed
the hooks, every operator still gets Data-Juicer's own wrapper to fall back on, and a moved hook names itself."""

from __future__ import annotations

import types

import pytest

from data_juicer_elastic.compat import dj_op_error_hooks


def test_self_check():
    assert "catch_map_batches_exception" in dj_op_error_hooks.self_check()


def test_the_plugin_installed_the_hooks():
    import data_juicer.ops.base_op as base_op

    assert dj_op_error_hooks.installed(base_op)


def test_the_wrap_gets_data_juicer_s_wrapper_and_the_call():
    module = types.ModuleType("base_op")

    def catch_map_batches_exception(method, skip_op_error=False, op_name=None):
        return ("dj", method, skip_op_error, op_name)

    def catch_map_single_exception(method, return_sample=True, skip_op_error=False, op_name=None):
        return ("dj-single", method)

    module.catch_map_batches_exception = catch_map_batches_exception
    module.catch_map_single_exception = catch_map_single_exception
    seen = []
    dj_op_error_hooks.install(module, lambda built, call: seen.append((built, call)) or "ours")
    assert module.catch_map_batches_exception(len, skip_op_error=True, op_name="x") == "ours"
    assert module.catch_map_single_exception(len, False, True) == "ours"
    (built, call), (built_single, single) = seen
    assert built == ("dj", len, True, "x") and call.batched and call.skip_op_error and call.op_name == "x"
    assert built_single == ("dj-single", len) and not single.batched and single.return_sample is False
    dj_op_error_hooks.install(module, lambda built, call: "again")  # idempotent: the first wrap stays
    assert module.catch_map_batches_exception(len) == "ours"


def test_a_moved_hook_names_itself():
    with pytest.raises(AttributeError, match="catch_map_batches_exception not found"):
        dj_op_error_hooks.install(types.ModuleType("base_op"), lambda built, call: built)
