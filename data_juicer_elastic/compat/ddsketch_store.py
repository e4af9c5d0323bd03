"""ddsketch 3.x: the bins of a ``ddsketch.store.DenseStore`` (``bins[key - offset]`` is the count of
``key``; ``min_key``, ``max_key``, ``count``) and ``LogarithmicMapping.gamma`` / ``min_possible``:
``stats.columns`` stores a column's sketch as plain JSON (first key, run of counts) that any process
can merge; ddsketch's own encoding is protobuf.  Decoding uses the public ``add``.
"""

from __future__ import annotations

from typing import Any, Final

from data_juicer_elastic.errors import IntegrationError

MODULE: Final = "ddsketch.store"
TARGET: Final = f"{MODULE}.DenseStore.bins"
REQUIREMENT: Final = "ddsketch>=3.0.1,<4"


def encode_store(store: Any) -> list[Any]:
    """``[first key, [count of each key from the first to the last]]`` (``[0, []]`` when empty)."""
    if store.count == 0:
        return [0, []]
    return [store.min_key, [int(store.bins[key - store.offset]) for key in range(store.min_key, store.max_key + 1)]]


def check_ddsketch_store() -> str:
    try:
        from ddsketch.mapping import LogarithmicMapping
        from ddsketch.store import DenseStore
    except ImportError as exc:
        raise IntegrationError(f"cannot import {MODULE}: {exc}", where=TARGET, hint=f"install {REQUIREMENT}") from exc
    store = DenseStore()
    store.add(-3, 2)
    store.add(5, 1)
    mapping = LogarithmicMapping(0.01)
    encoded = encode_store(store)
    if encoded != [-3, [2, 0, 0, 0, 0, 0, 0, 0, 1]] or not (mapping.gamma > 1 and mapping.min_possible > 0):
        raise IntegrationError(
            f"{TARGET}: a store of keys -3 (x2) and 5 encodes as {encoded}", where=TARGET, hint=f"install {REQUIREMENT}"
        )
    return f"{TARGET}, offset, min_key, max_key and LogarithmicMapping.gamma found"
