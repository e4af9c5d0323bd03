"""execution._read_once: a shard's input is read by Ray once, and the patch stays inside the shard run."""

from __future__ import annotations

import inspect
import threading

import pytest
from data_juicer.core.data.ray_dataset import RayDataset

from data_juicer_elastic.errors import IntegrationError
from data_juicer_elastic.execution import _read_once
from data_juicer_elastic.execution._read_once import TARGET, read_once

from .conftest import write_shard


def _read_attr():
    return inspect.getattr_static(RayDataset, "read")


def test_patch_is_active_only_inside_and_nested_runs_share_it():
    original = _read_attr()
    with read_once():
        patched = _read_attr()
        assert patched is not original and isinstance(patched, classmethod)
        with read_once():  # a second shard run (another slot thread) reuses the patch
            assert _read_attr() is patched
        assert _read_attr() is patched  # the inner run ending must not unpatch the outer one
    assert _read_attr() is original


def test_patch_is_restored_when_the_shard_run_fails():
    original = _read_attr()
    with pytest.raises(RuntimeError, match="boom"), read_once():
        raise RuntimeError("boom")
    assert _read_attr() is original


def test_threads_overlapping_restore_the_original_once_all_are_done():
    original = _read_attr()
    inside, release = threading.Barrier(3), threading.Event()

    def shard_run():
        with read_once():
            inside.wait()
            release.wait()

    threads = [threading.Thread(target=shard_run) for _ in range(2)]
    for thread in threads:
        thread.start()
    inside.wait()
    assert _read_attr() is not original
    release.set()
    for thread in threads:
        thread.join()
    assert _read_attr() is original and _read_once._active == 0


def test_a_moved_internal_gives_one_integration_error(monkeypatch):
    monkeypatch.setattr(RayDataset, "read", staticmethod(lambda *a, **k: None))
    with pytest.raises(IntegrationError, match="RayDataset.read is missing or no longer a classmethod") as info:
        with read_once():
            pass
    assert info.value.where == "py-data-juicer" and TARGET in str(info.value)
    assert _read_once._active == 0


@pytest.mark.ray
def test_the_read_comes_back_materialized(ray_runtime, tmp_path):
    from ray.data.dataset import MaterializedDataset

    shard = write_shard(tmp_path / "s.jsonl", 50)
    with read_once():
        dataset = RayDataset.read("json", str(shard))
    assert isinstance(dataset, MaterializedDataset)
    assert dataset.count() == 50
    assert [row["idx"] for row in dataset.take_all()] == list(range(50))
    assert not isinstance(RayDataset.read("json", str(shard)), MaterializedDataset)  # lazy again outside
