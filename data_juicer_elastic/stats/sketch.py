"""Mergeable quantile sketch of one numeric column (DDSketch, relative-value accuracy ALPHA): a deterministic
bound, and merging adds bin counts, so any sharding gives the same numbers.  The bound: docs/analysis.md.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np
from ddsketch.mapping import LogarithmicMapping
from ddsketch.store import DenseStore

from data_juicer_elastic.compat.ddsketch_store import encode_store

ALPHA: Final = 0.01  # relative accuracy of every quantile value


class QuantileSketch:
    """DDSketch's pieces (logarithmic mapping, dense bin stores) with an integer-rank query, numpy bulk adds and a
    JSON encoding."""

    def __init__(self, alpha: float = ALPHA):
        self.alpha = alpha
        self._mapping = LogarithmicMapping(alpha)
        self._positive = DenseStore()
        self._negative = DenseStore()  # |v| of negative values
        self._zero = 0  # values too close to 0 for a bin (|v| <= the mapping's min_possible)
        self._log_gamma = math.log(self._mapping.gamma)

    @property
    def count(self) -> int:
        return int(self._positive.count + self._negative.count + self._zero)

    def add_array(self, values: np.ndarray) -> None:
        """Add a 1-d float array.  Keys are the mapping's own ``ceil(log(v) / log(gamma))`` in numpy (its
        ``key()`` costs ~1 us a value); a value on a bin boundary may land in the neighbouring bin through
        rounding, whose representative is then also within ALPHA of it."""
        if values.size == 0:
            return
        tiny = self._mapping.min_possible
        positive, negative = values[values > tiny], -values[values < -tiny]
        self._zero += int(values.size - positive.size - negative.size)
        for store, part in ((self._positive, positive), (self._negative, negative)):
            if part.size:
                keys, counts = np.unique(np.ceil(np.log(part) / self._log_gamma).astype(np.int64), return_counts=True)
                for key, weight in zip(keys.tolist(), counts.tolist(), strict=True):
                    store.add(key, weight)

    def merge(self, other: QuantileSketch) -> None:
        if other.alpha != self.alpha:
            raise ValueError(f"cannot merge sketches of accuracy {self.alpha} and {other.alpha}")
        self._positive.merge(other._positive)
        self._negative.merge(other._negative)
        self._zero += other._zero

    def value_at_rank(self, rank: int) -> float:
        """The representative of the ``rank``-th smallest value (0-based); DDSketch's own lookup
        (``get_quantile_value``) for an integer rank, which a float quantile can round past."""
        negative, zero = self._negative, self._zero
        if not 0 <= rank < self.count:
            raise IndexError(f"rank {rank} outside a sketch of {self.count} values")
        if rank < negative.count:
            # the negative store holds |v| ascending: the rank-th smallest v is its (count-1-rank)-th
            return -self._mapping.value(negative.key_at_rank(negative.count - 1 - rank))
        if rank < negative.count + zero:
            return 0.0
        return self._mapping.value(self._positive.key_at_rank(rank - negative.count - zero))

    def quantile(self, q: float) -> float | None:
        """pandas' linear-interpolation quantile, each end within ALPHA of the exact value; None when empty."""
        n = self.count
        if n == 0:
            return None
        h = q * (n - 1)
        low, high = math.floor(h), math.ceil(h)
        lo_value = self.value_at_rank(low)
        if high == low:
            return lo_value
        return lo_value + (h - low) * (self.value_at_rank(high) - lo_value)

    def to_dict(self) -> dict[str, Any]:
        """Each store's bins as ``[first key, [counts...]]``."""
        return {
            "alpha": self.alpha,
            "zero": int(self._zero),
            "positive": encode_store(self._positive),
            "negative": encode_store(self._negative),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantileSketch:
        alpha = data["alpha"]
        if not isinstance(alpha, float) or not 0 < alpha < 1:
            raise ValueError(f"bad sketch accuracy {alpha!r}")
        zero = _count(data["zero"])
        made = cls(alpha)
        _decode_store(made._positive, data["positive"])
        _decode_store(made._negative, data["negative"])
        made._zero = zero
        return made


def _decode_store(store: Any, data: Any) -> None:
    if not isinstance(data, list) or len(data) != 2 or not isinstance(data[1], list):
        raise ValueError(f"bad sketch store {data!r:.80}")
    first = data[0]
    if isinstance(first, bool) or not isinstance(first, int):
        raise ValueError(f"bad sketch key {first!r}")
    for offset, weight in enumerate(map(_count, data[1])):
        if weight:
            store.add(first + offset, weight)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"bad sketch count {value!r}")
    return value
