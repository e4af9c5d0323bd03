"""One mergeable summary per stats column, and the row collector that fills them, choosing and treating
columns as Data-Juicer 1.6.1's ``OverallAnalysis`` does (the table: docs/analysis.md, "What is computed").

A numeric column's summary is exact, mergeable :class:`Moments` (count, mean, M2 (the sum of squared
deviations), min, max, merged with Chan et al.'s pairwise update: numerically stable) and a mergeable
:class:`QuantileSketch` (DDSketch, relative-value accuracy ALPHA: a deterministic bound, and merging
adds bin counts, so any sharding gives the same numbers).  The bound: docs/analysis.md.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from ddsketch.mapping import LogarithmicMapping
from ddsketch.store import DenseStore

from data_juicer_elastic.compat.ddsketch_store import encode_store
from data_juicer_elastic.jobdir.exports import META_FIELD, STATS_FIELD

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


TAG_PREFIX: Final = "__dj__"  # Data-Juicer's DEFAULT_PREFIX: only such meta keys are analysed
MAX_DISTINCT: Final = 10_000  # exact value counts per categorical column, beyond which unique/top/freq are unknown
_CHUNK: Final = 65_536  # numeric values buffered per column before they are folded into numpy summaries


class ColumnKind(enum.StrEnum):
    EMPTY = "empty"  # no value seen yet (only missing ones)
    NUMERIC = "numeric"
    CATEGORICAL = "categorical"  # strings
    BOOLEAN = "boolean"  # described like strings (count, unique, top, freq), but never mixed with them
    SKIPPED = "skipped"

    @property
    def counts_values(self) -> bool:
        return self in (ColumnKind.CATEGORICAL, ColumnKind.BOOLEAN)


class Shape(enum.StrEnum):
    UNKNOWN = "unknown"
    SCALAR = "scalar"
    LIST = "list"


@dataclass
class ColumnSummary:
    source: str  # "stats" or "meta"
    name: str
    kind: ColumnKind = ColumnKind.EMPTY
    shape: Shape = Shape.UNKNOWN
    moments: Moments = field(default_factory=Moments)
    sketch: QuantileSketch = field(default_factory=QuantileSketch)
    categorical_count: int = 0
    values: dict[Any, int] | None = field(default_factory=dict)  # None once past MAX_DISTINCT
    reason: str | None = None  # why the column is skipped

    @property
    def key(self) -> tuple[str, str]:
        return (self.source, self.name)

    def skip(self, reason: str) -> None:
        if self.kind is not ColumnKind.SKIPPED:
            self.kind, self.reason = ColumnKind.SKIPPED, reason
            self.moments, self.sketch, self.values, self.categorical_count = Moments(), QuantileSketch(), {}, 0

    def set_kind(self, kind: ColumnKind, shape: Shape) -> bool:
        """Adopt or check the column's kind and shape; False (and skipped) on a conflict."""
        if self.kind is ColumnKind.SKIPPED:
            return False
        if self.shape is not Shape.UNKNOWN and shape is not Shape.UNKNOWN and shape is not self.shape:
            self.skip("mixes lists and single values")
            return False
        if self.kind is not ColumnKind.EMPTY and kind is not ColumnKind.EMPTY and kind is not self.kind:
            self.skip(f"mixes {self.kind} and {kind} values")
            return False
        if shape is not Shape.UNKNOWN:
            self.shape = shape
        if kind is not ColumnKind.EMPTY:
            self.kind = kind
        return True

    def add_categories(self, counts: Iterable[tuple[Any, int]]) -> None:
        for value, count in counts:
            self.categorical_count += count
            if self.values is not None:
                self.values[value] = self.values.get(value, 0) + count
        if self.values is not None and len(self.values) > MAX_DISTINCT:
            self.values = None

    def merge(self, other: ColumnSummary) -> None:
        """Fold ``other`` (the same column of later rows) into this one."""
        if other.kind is ColumnKind.SKIPPED:
            self.skip(other.reason or "skipped")
            return
        if not self.set_kind(other.kind, other.shape):
            return
        if other.kind is ColumnKind.NUMERIC:
            self.moments = self.moments.merge(other.moments)
            self.sketch.merge(other.sketch)
        elif other.kind.counts_values:
            if other.values is None:
                self.categorical_count += other.categorical_count
                self.values = None
            else:
                self.add_categories(other.values.items())

    @property
    def count(self) -> int:
        return self.moments.count if self.kind is ColumnKind.NUMERIC else self.categorical_count


def _scalar_kind(value: Any) -> ColumnKind | None:
    if isinstance(value, bool):  # first: a bool is also an int
        return ColumnKind.BOOLEAN
    if isinstance(value, str):
        return ColumnKind.CATEGORICAL
    if isinstance(value, int | float):
        return ColumnKind.NUMERIC
    return None


_NUMBER_TYPES: Final = (int, float)
_FAST_TYPES: Final = {ColumnKind.NUMERIC: _NUMBER_TYPES, ColumnKind.CATEGORICAL: (str,), ColumnKind.BOOLEAN: (bool,)}


class _Pending:
    """Values of one column not yet folded into its summary (cheap per-row appends).

    ``fast`` holds the exact Python types a single value may have to skip the kind/shape checks (set once the
    column is known to be scalar of that kind): the per-row cost of a summary is mostly these checks, and a stat
    column almost never changes type.
    """

    __slots__ = ("numbers", "categories", "fast")

    def __init__(self) -> None:
        self.numbers: list[float] = []
        self.categories: dict[Any, int] = {}
        self.fast: tuple[type, ...] = ()

    def add(self, value: Any, numeric: bool) -> bool:
        """Buffer one value; True when the buffer is full and must be folded into the summary."""
        if numeric:
            self.numbers.append(value)
            return len(self.numbers) >= _CHUNK
        self.categories[value] = self.categories.get(value, 0) + 1
        return len(self.categories) > MAX_DISTINCT


class StatsCollector:
    """Feed it every output row (``add_row``); ``columns()`` gives the summaries in first-seen order."""

    def __init__(self) -> None:
        self.rows = 0
        self._columns: dict[tuple[str, str], ColumnSummary] = {}
        self._pending: dict[tuple[str, str], _Pending] = {}

    def add_row(self, row: dict[str, Any]) -> None:
        self.rows += 1
        stats = row.get(STATS_FIELD)
        if isinstance(stats, dict):
            for name, value in stats.items():
                self._add("stats", name, value)
        meta = row.get(META_FIELD)
        if isinstance(meta, dict):
            for name, value in meta.items():
                if name.startswith(TAG_PREFIX):
                    self._add("meta", name, value)

    def _add(self, source: str, name: str, value: Any) -> None:
        key = (source, name)
        pending = self._pending.get(key)
        if pending is not None and type(value) in pending.fast:  # type(), not isinstance: a bool is an int
            if pending.add(value, pending.fast is _NUMBER_TYPES):
                self._flush(self._columns[key], pending)
            return
        column = self._columns.get(key)
        if column is None:
            column = self._columns[key] = ColumnSummary(source, name)
            pending = self._pending[key] = _Pending()
        if value is None or column.kind is ColumnKind.SKIPPED:
            return
        self._add_slow(column, key, value)
        if column.kind is ColumnKind.SKIPPED:
            self._flush(column, self._pending[key])  # drops what was pending, and the fast path

    def _add_slow(self, column: ColumnSummary, key: tuple[str, str], value: Any) -> None:
        if isinstance(value, list):
            if not column.set_kind(ColumnKind.EMPTY, Shape.LIST):
                return
            for item in value:
                if item is not None and not self._add_scalar(column, key, item):
                    return
            return
        if column.set_kind(ColumnKind.EMPTY, Shape.SCALAR) and self._add_scalar(column, key, value):
            self._pending[key].fast = _FAST_TYPES[column.kind]

    def _add_scalar(self, column: ColumnSummary, key: tuple[str, str], value: Any) -> bool:
        kind = _scalar_kind(value)
        if kind is None:
            column.skip(f"holds {type(value).__name__} values, which dj-analyze does not analyse")
            return False
        if not column.set_kind(kind, Shape.UNKNOWN):
            return False
        pending = self._pending[key]
        if pending.add(value, kind is ColumnKind.NUMERIC):
            self._flush(column, pending)
        return True

    def _flush(self, column: ColumnSummary, pending: _Pending) -> None:
        if column.kind is ColumnKind.SKIPPED:
            pending.numbers, pending.categories, pending.fast = [], {}, ()
            return
        if pending.numbers:
            try:
                values = np.asarray(pending.numbers, dtype=np.float64)
            except OverflowError:  # a JSON integer beyond float range
                values = np.array([math.inf])
            pending.numbers = []
            if not np.isfinite(values).all():
                column.skip("holds numbers beyond the float range, which pandas cannot describe either")
                pending.categories, pending.fast = {}, ()
                return
            column.moments = column.moments.merge(Moments.of(values))
            column.sketch.add_array(values)
        if pending.categories:
            column.add_categories(pending.categories.items())
            pending.categories = {}

    def columns(self) -> list[ColumnSummary]:
        """Stats columns, then meta tag columns (dj-analyze's order), each in first-seen order."""
        for key, column in self._columns.items():
            self._flush(column, self._pending[key])
        return sorted(self._columns.values(), key=lambda c: c.source != "stats")
