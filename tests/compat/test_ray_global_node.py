"""compat.ray_global_node: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

import pytest

from data_juicer_elastic.compat import ray_global_node


def test_self_check():
    assert "_global_node.all_processes" in ray_global_node.self_check()


def test_no_node_was_started_by_this_process():
    import ray

    if ray.is_initialized():
        pytest.skip("a Ray runtime was started by an earlier test in this process")
    assert ray_global_node.node_process_ids() == []
