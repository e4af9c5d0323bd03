"""compat.ddsketch_store: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

from data_juicer_elastic.compat import ddsketch_store


def test_self_check():
    assert "DenseStore.bins" in ddsketch_store.check_ddsketch_store()


def test_an_empty_store_encodes_as_no_bins():
    from ddsketch.store import DenseStore

    assert ddsketch_store.encode_store(DenseStore()) == [0, []]
