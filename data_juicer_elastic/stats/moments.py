"""Exact, mergeable moments of one numeric column: count, mean, M2 (the sum of squared deviations), min, max,
merged with Chan et al.'s pairwise update (numerically stable; docs/analysis.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Moments:
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    @classmethod
    def of(cls, values: np.ndarray) -> Moments:
        """Moments of a 1-d float array, two-pass (as pandas computes them)."""
        if values.size == 0:
            return cls()
        mean = float(values.mean())
        deviations = values - mean
        return cls(
            int(values.size), mean, float(np.dot(deviations, deviations)), float(values.min()), float(values.max())
        )

    def merge(self, other: Moments) -> Moments:
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        n = self.count + other.count
        delta = other.mean - self.mean
        # Weighted mean rather than ``self.mean + delta * other.count / n``: equal for exact
        # arithmetic, and it keeps the mean of identical values exactly that value.
        mean = (self.mean * self.count + other.mean * other.count) / n
        if not math.isfinite(mean):  # huge values overflow the weighted sum; the delta form does not
            mean = self.mean + delta * (other.count / n)
        m2 = self.m2 + other.m2 + delta * delta * (self.count * other.count / n)
        return Moments(n, mean, m2, min(self.min, other.min), max(self.max, other.max))

    @property
    def std(self) -> float | None:
        """Sample standard deviation (ddof=1), as pandas' ``describe``; None below two values."""
        if self.count < 2:
            return None
        return math.sqrt(max(self.m2, 0.0) / (self.count - 1))

    def to_dict(self) -> dict[str, Any]:
        if self.count == 0:
            return {"count": 0}
        return {"count": self.count, "mean": self.mean, "m2": self.m2, "min": self.min, "max": self.max}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Moments:
        count = data["count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"bad count {count!r}")
        if count == 0:
            return cls()
        values = [data[key] for key in ("mean", "m2", "min", "max")]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            raise ValueError(f"bad moments {values!r}")
        mean, m2, low, high = (float(v) for v in values)
        if m2 < 0 or low > high:
            raise ValueError(f"inconsistent moments (m2={m2}, min={low}, max={high})")
        return cls(count, mean, m2, low, high)
