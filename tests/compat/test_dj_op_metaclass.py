"""compat.dj_op_metaclass: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

import pytest

from data_juicer_elastic.compat import dj_op_metaclass


def test_self_check():
    assert "OPMetaClass.__call__" in dj_op_metaclass.self_check()


def test_the_plugin_installed_the_hook():
    import data_juicer.ops.base_op as base_op

    assert dj_op_metaclass.installed(base_op)


def test_a_moved_metaclass_names_itself():
    import types

    with pytest.raises(AttributeError, match="OPMetaClass.__call__ not found"):
        dj_op_metaclass.install(types.ModuleType("base_op"), lambda cls, requested: cls)
