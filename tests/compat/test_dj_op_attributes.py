"""compat.dj_op_attributes: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

from data_juicer_elastic.compat import dj_op_attributes


def test_self_check():
    assert "_init_kwargs" in dj_op_attributes.self_check()


def test_rebase_sets_the_per_attempt_argument_everywhere_data_juicer_reads_it():
    from data_juicer.ops import load_ops

    item = {"whitespace_normalization_mapper": {"work_dir": "/a"}}
    (op,) = load_ops([item])
    moved = {"whitespace_normalization_mapper": {"work_dir": "/b"}}
    dj_op_attributes.rebase_op(op, moved, {"work_dir": "/b"})
    assert op.work_dir == "/b" and op._init_kwargs["work_dir"] == "/b" and op._op_cfg is moved
    assert dj_op_attributes.op_name(op) == dj_op_attributes.op_name(type(op)) == "whitespace_normalization_mapper"
