"""compat.dj_ray_dataset: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

from data_juicer_elastic.compat import dj_ray_dataset


def test_self_check():
    assert "RayDataset.read" in dj_ray_dataset.self_check()


def test_read_is_replaced_and_restored():
    cls = dj_ray_dataset.ray_dataset_class()
    original = dj_ray_dataset.read_method()
    saved = dj_ray_dataset.replace_read(lambda klass, data_format, paths, **kwargs: (data_format, paths))
    try:
        assert cls.read("json", "x.jsonl") == ("json", "x.jsonl")
    finally:
        dj_ray_dataset.restore_read(saved)
    assert dj_ray_dataset.read_method() is original
