"""The micro-batch size policy: pure (no Ray, torch or GPU import), clock-injected, bounded state.

The policy keeps a cost **budget**; the caller takes the longest prefix of the remaining rows that
fits (:meth:`BatchPolicy.choose_rows`).  The rules: docs/adaptive-batching.md, "The size controller".

Which exceptions a smaller micro-batch can fix (:func:`classify_oom`): only a failure of *this process*
to allocate memory for *this call*; never a sticky CUDA error, an NCCL error or Ray's host-memory OOM
(Ray retries the task itself).  torch is never imported here: an exception raised by torch means it is
in ``sys.modules``.
"""

from __future__ import annotations

import enum
import math
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final


class OomKind(enum.StrEnum):
    """The allocation failure a smaller micro-batch can recover from."""

    TORCH = "torch"  # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError, or its RuntimeError message
    ACCELERATOR = "accelerator"  # torch.AcceleratorError "out of memory" (recent torch; not sticky)
    CUBLAS = "cublas"  # CUBLAS_STATUS_ALLOC_FAILED
    CUDNN = "cudnn"  # CUDNN_STATUS_ALLOC_FAILED
    CPU_ALLOCATOR = "cpu-allocator"  # DefaultCPUAllocator: can't allocate memory
    MEMORY_ERROR = "memory-error"  # Python's MemoryError (a host allocation failed in this process)


# Lower-case message markers of RuntimeErrors, first match wins.
_MESSAGE_MARKERS: Final = (
    ("cublas_status_alloc_failed", OomKind.CUBLAS),
    ("cudnn_status_alloc_failed", OomKind.CUDNN),
    ("can't allocate memory", OomKind.CPU_ALLOCATOR),  # "DefaultCPUAllocator: can't allocate memory"
    ("out of memory", OomKind.TORCH),  # "CUDA out of memory.", "CUDA error: out of memory", "HIP out of memory"
)
# Messages that are never an allocation failure, even if they also say "out of memory".
_NOT_OOM_MARKERS: Final = ("nccl", "illegal memory access", "device-side assert", "unspecified launch failure")


def classify_oom(exc: BaseException) -> OomKind | None:
    """The kind of recoverable allocation OOM ``exc`` is, or None when a smaller batch cannot help."""
    if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit, our own interrupts
        return None
    if any(cls.__module__.split(".", 1)[0] == "ray" for cls in type(exc).__mro__):
        return None  # Ray's host-memory OutOfMemoryError, RayTaskError wrappers
    torch = sys.modules.get("torch")
    if torch is not None:
        distributed_error = getattr(sys.modules.get("torch.distributed"), "DistError", None)
        if distributed_error is not None and isinstance(exc, distributed_error):
            return None  # DistBackendError (NCCL) and friends: not a local allocation
        oom_class = getattr(torch, "OutOfMemoryError", None) or getattr(
            getattr(torch, "cuda", None), "OutOfMemoryError", None
        )
        if oom_class is not None and isinstance(exc, oom_class):
            return OomKind.TORCH
        accelerator_error = getattr(torch, "AcceleratorError", None)
        if accelerator_error is not None and isinstance(exc, accelerator_error):
            # AcceleratorError also carries sticky errors: only its OOM is retryable.
            text = str(exc).lower()
            oom = "out of memory" in text and not any(marker in text for marker in _NOT_OOM_MARKERS)
            return OomKind.ACCELERATOR if oom else None
    if isinstance(exc, MemoryError):
        return OomKind.MEMORY_ERROR
    if isinstance(exc, RuntimeError):
        message = str(exc).lower()
        if any(marker in message for marker in _NOT_OOM_MARKERS):
            return None
        for marker, kind in _MESSAGE_MARKERS:
            if marker in message:
                return kind
    return None


INF: Final = math.inf
# What BatchPolicy.state() reports after the budget, in this order.
_STATE: Final = "safe failing max_rows successes ooms drift_ooms floor_waits reprobes max_slice_ooms".split()


class Action(enum.StrEnum):
    RETRY = "retry"  # retry the same input offset now (after cleanup)
    WAIT = "wait"  # at the minimum size: wait ``wait_secs``, then retry the same rows
    FAIL = "fail"  # nothing smaller exists and the waits are spent: raise


@dataclass(frozen=True)
class OomDecision:
    action: Action
    wait_secs: float = 0.0
    same_size: bool = False  # a fragmentation test: the same rows at the same size after cleanup


@dataclass(frozen=True)
class PolicyConfig:
    min_rows: int = 1
    successes_before_growth: int = 2
    growth: float = 1.25  # per growth step while no failing size is known
    approach: float = 0.5  # fraction of the gap to a known failing size closed per growth step
    min_gap: float = 0.05  # never plan within 5% of a known failing size
    reprobe_successes: int = 256
    reprobe_secs: float = 300.0
    max_reprobe_backoff: int = 8
    floor_retries: int = 3
    floor_backoff_secs: float = 1.0
    trace_len: int = 32

    def __post_init__(self) -> None:
        if self.min_rows < 1:
            raise ValueError("min_rows must be >= 1")
        if self.successes_before_growth < 1:
            raise ValueError("successes_before_growth must be >= 1")
        if not self.growth > 1:
            raise ValueError("growth must be > 1")
        if not 0 < self.approach <= 1 or not 0 <= self.min_gap < 1:
            raise ValueError("approach must be in (0, 1] and min_gap in [0, 1)")
        if self.reprobe_successes < 1 or not self.reprobe_secs > 0 or self.max_reprobe_backoff < 1:
            raise ValueError("re-probe intervals must be positive")
        if self.floor_retries < 0 or self.floor_backoff_secs < 0 or self.trace_len < 1:
            raise ValueError("floor_retries, floor_backoff_secs must be >= 0 and trace_len >= 1")


class BatchPolicy:
    """One operator's micro-batch budget in one process."""

    def __init__(
        self, max_rows: int, config: PolicyConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ):
        self.config = config or PolicyConfig()
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < self.config.min_rows:
            raise ValueError(f"max_rows must be an integer >= {self.config.min_rows}, got {max_rows!r}")
        self.max_rows = max_rows
        self._clock = clock
        self.budget: float = INF  # cost budget of the next micro-batch
        self.failing: float | None = None  # smallest cost that OOMed, while in force
        self.safe: float | None = None  # largest cost that succeeded since the last drift
        self._failing_since = 0.0
        self._since_failing = 0  # successes since ``failing`` was set
        self._backoff = 1  # re-probe interval multiplier
        self._reprobing: float | None = None  # an expired failing size being re-tested
        self._streak = 0
        self._frag_hits = 0  # same-size retries after cleanup that succeeded ...
        self._frag_misses = 0  # ... and that failed again
        self.begin_slice()  # per slice state
        # counters (telemetry)
        self.successes = self.ooms = self.drift_ooms = self.floor_waits = self.reprobes = self.max_slice_ooms = 0
        # (outcome, rows, cost, budget before): the last few events, for telemetry
        self.trace: deque[tuple[str, int, float, float | None]] = deque(maxlen=self.config.trace_len)

    @property
    def slice_oom_budget(self) -> int:
        """The most OOMs one slice can see before FAIL: fragmentation test + gentle shrink +
        halvings to the floor + the floor's waits and its last try."""
        halvings = math.ceil(math.log2(self.max_rows / self.config.min_rows)) if self.max_rows > 1 else 0
        return 2 + halvings + self.config.floor_retries + 1

    def begin_slice(self) -> None:
        """A new input offset starts: per-slice retry state resets."""
        self._slice_ooms = 0
        self._shrunk = False
        self._row_cap = self.max_rows
        self._floor_waits = 0
        self._frag_pending = False

    def choose_rows(self, remaining: int, prefix_cost: Callable[[int], float] | None = None) -> int:
        """The most rows (<= remaining, <= the row cap) whose prefix cost fits the budget; at least
        ``min(min_rows, remaining)``.  ``prefix_cost(n)`` must not decrease with n (None: cost = rows)."""
        if remaining <= 0:
            return 0
        cap = min(remaining, self._row_cap)
        floor = min(self.config.min_rows, cap)
        cost = prefix_cost or float
        if self.budget == INF or cost(cap) <= self.budget:
            return cap
        lo, hi = floor, cap  # cost(lo) may exceed the budget: a slice never has fewer than min_rows
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cost(mid) <= self.budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def on_success(self, rows: int, cost: float, *, budget_bound: bool) -> None:
        """A micro-batch of ``rows`` rows and ``cost`` succeeded.  ``budget_bound``: the budget
        (not the end of the outer batch) ended it, so it is evidence about the budget."""
        self.successes += 1
        self.trace.append(("ok", rows, float(cost), self._budget_or_none()))
        if self._frag_pending:
            self._frag_hits += 1
            self._frag_pending = False
        if self._reprobing is not None and cost >= self._reprobing:
            self._reprobing, self._backoff = None, 1  # the old failing size fits again: drift proven
        if self.failing is not None:
            self._since_failing += 1
            interval = self._backoff
            if (
                self._since_failing >= self.config.reprobe_successes * interval
                or self._clock() - self._failing_since >= self.config.reprobe_secs * interval
            ):
                self._reprobing, self.failing = self.failing, None
                self.reprobes += 1
        if self.failing is None or cost < self.failing:
            self.safe = cost if self.safe is None else max(self.safe, cost)
        if not budget_bound:
            return
        self._streak += 1
        if self._streak >= self.config.successes_before_growth:
            self._streak = 0
            self._grow()

    def on_oom(self, rows: int, cost: float) -> OomDecision:
        """A micro-batch OOMed: what to do with the same input offset."""
        self.ooms += 1
        self._slice_ooms += 1
        self.max_slice_ooms = max(self.max_slice_ooms, self._slice_ooms)
        self._streak = 0
        self.trace.append(("oom", rows, float(cost), self._budget_or_none()))
        reprobe_failed = self._reprobing
        if reprobe_failed is not None:
            # A re-probe above an expired failing size failed: wait longer before the next one.
            self._backoff = min(self._backoff * 2, self.config.max_reprobe_backoff)
            self._reprobing = None
        if rows <= self.config.min_rows:
            return self._at_floor()
        frag_test = self._frag_pending
        self._frag_pending = False
        if frag_test:
            self._frag_misses += 1
        drift = self.safe is not None and cost <= self.safe
        if drift and not frag_test and self._slice_ooms == 1 and self._frag_hits >= self._frag_misses:
            # A size that worked failed: retry it once after cleanup before believing it.
            self.drift_ooms += 1
            self._frag_pending = True
            self._row_cap = rows
            return OomDecision(Action.RETRY, same_size=True)
        if drift or frag_test:
            self.safe = None  # what succeeded before is no longer evidence
        # A failed re-probe confirms the old failing size: restore it rather than approach it again.
        self._set_failing(cost if reprobe_failed is None else min(cost, reprobe_failed))
        if not self._shrunk and self.safe is not None and self.safe < cost:
            target = max(self.safe, cost / 2)
        else:
            target = cost / 2
        self.budget = min(self.budget, target)
        # Never the same size twice in a row for one slice; after the first shrink, halve.
        self._row_cap = max(self.config.min_rows, rows - 1 if not self._shrunk else rows // 2)
        self._shrunk = True
        return OomDecision(Action.RETRY)

    def _at_floor(self) -> OomDecision:
        # One row cannot be split; its failure says nothing about larger budgets (it may be a
        # transient neighbour or one poison row), so the budget and failing size stay as they are.
        if self._floor_waits < self.config.floor_retries:
            self._floor_waits += 1
            self.floor_waits += 1
            self._row_cap = self.config.min_rows
            return OomDecision(Action.WAIT, wait_secs=self.config.floor_backoff_secs * self._floor_waits)
        return OomDecision(Action.FAIL)

    def _set_failing(self, cost: float) -> None:
        self.failing = cost if self.failing is None else min(self.failing, cost)
        self._failing_since = self._clock()
        self._since_failing = 0
        if self.safe is not None and self.safe >= self.failing:
            self.safe = None

    def _grow(self) -> None:
        if self.budget == INF:
            return
        if self.failing is not None:
            ceiling = self.failing * (1 - self.config.min_gap)
            target = self.budget + (self.failing - self.budget) * self.config.approach
            self.budget = max(self.budget, min(target, ceiling))
        elif self._reprobing is not None and self.budget < self._reprobing:
            # Re-probe just above the expired failing size: a failure costs a small call.
            self.budget = min(self.budget * self.config.growth, self._reprobing * (1 + self.config.min_gap))
        else:
            self.budget *= self.config.growth

    def _budget_or_none(self) -> float | None:
        return None if self.budget == INF else self.budget

    def seed(self, *, safe: float | None, failing: float | None) -> None:
        """Start from what another process learned (before any observation of this one)."""
        if self.successes or self.ooms:
            raise RuntimeError("seed() is only valid before the first observation")
        if failing is not None and failing > 0:
            self.failing = float(failing)
            self._failing_since = self._clock()
        if safe is not None and safe > 0 and (self.failing is None or safe < self.failing):
            self.safe = float(safe)
            self.budget = float(safe)
        elif self.failing is not None:
            self.budget = self.failing / 2

    def state(self) -> dict[str, Any]:
        """Plain numbers for telemetry and profiles (JSON-safe: no infinities)."""
        return {"budget": self._budget_or_none(), **{name: getattr(self, name) for name in _STATE}}
