"""compat.ray_worker_mode: a Ray worker told from a driver through Ray's worker module."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from data_juicer_elastic.compat import ray_worker_mode


def test_self_check_finds_the_worker_mode_of_this_driver():
    assert "found" in ray_worker_mode.self_check()
    assert ray_worker_mode.is_ray_worker() is False


def test_a_process_whose_global_worker_is_in_worker_mode_is_a_worker(monkeypatch):
    worker = SimpleNamespace(WORKER_MODE=1, global_worker=SimpleNamespace(mode=1))
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(_private=SimpleNamespace(worker=worker)))
    assert ray_worker_mode.is_ray_worker() is True
    worker.global_worker.mode = 0  # SCRIPT_MODE: a driver
    assert ray_worker_mode.is_ray_worker() is False


def test_without_ray_imported_no_process_is_a_worker(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert ray_worker_mode.is_ray_worker() is False
