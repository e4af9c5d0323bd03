"""compat.dj_op_fusion: its self-check passes against the installed packages, and fails naming
``fuse_operators`` when it is missing or no longer takes the keywords RayExecutor passes."""

from __future__ import annotations

import pytest

from data_juicer_elastic import DATA_JUICER_REQUIREMENT
from data_juicer_elastic.compat import dj_op_fusion
from data_juicer_elastic.errors import IntegrationError


def test_self_check():
    assert "fuse_operators" in dj_op_fusion.self_check()


def test_a_missing_function_fails_the_self_check(monkeypatch):
    import data_juicer.ops.op_fusion as op_fusion

    monkeypatch.delattr(op_fusion, "fuse_operators")
    with pytest.raises(IntegrationError) as info:
        dj_op_fusion.self_check()
    assert f"{dj_op_fusion.TARGET} is missing" in str(info.value) and DATA_JUICER_REQUIREMENT in str(info.value)


def test_a_changed_signature_fails_the_self_check(monkeypatch):
    import data_juicer.ops.op_fusion as op_fusion

    monkeypatch.setattr(op_fusion, "fuse_operators", lambda ops, probe_res=None: ops)
    with pytest.raises(IntegrationError, match="no longer takes mapper_fusion, mapper_fusion_vram_limit"):
        dj_op_fusion.self_check()


def test_fused_is_data_juicers_fusion():
    from data_juicer.ops import load_ops
    from data_juicer.ops.op_fusion import fuse_operators

    process = [{"words_num_filter": {}}, {"word_repetition_filter": {}}, {"whitespace_normalization_mapper": {}}]

    def names(ops):
        return [op._name for op in ops]

    ours = dj_op_fusion.fused(load_ops(process), mapper_fusion=True, mapper_fusion_vram_limit=0.9)
    theirs = fuse_operators(load_ops(process), mapper_fusion=True, mapper_fusion_vram_limit=0.9)
    assert names(ours) == names(theirs)
    assert len(ours) < len(process)  # the two word filters share a context: fused into one
