"""compat.ray_streaming_executor: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

from data_juicer_elastic.compat import ray_streaming_executor


def test_self_check():
    assert "StreamingExecutor._topology" in ray_streaming_executor.self_check()


def test_no_execution_runs_here():
    assert ray_streaming_executor.live_executors() == []
