"""compat.ray_map_batches: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

from data_juicer_elastic.compat import ray_map_batches


def test_self_check():
    assert "ray.data.Dataset.map_batches" in ray_map_batches.self_check()


def test_the_swap_is_undone_after_the_block():
    from ray.data import Dataset

    original = Dataset.map_batches
    with ray_map_batches.map_batches_replaced(lambda found: "replacement"):
        assert Dataset.map_batches == "replacement"
    assert Dataset.map_batches is original
