"""py-data-juicer 1.6.1: ``data_juicer.ops.base_op.catch_map_batches_exception`` /
``catch_map_single_exception``, wrapped so an elastic shard can quarantine failing rows.

Every Mapper's and Filter's ``__init__`` wraps its ``process_*`` / ``compute_stats_*`` methods
with them; with ``skip_op_error`` (the default) that wrapper drops every row of a batch that
raised.  Each call still builds Data-Juicer's wrapper, then ``wrap(built, call)`` decides what
the operator gets (docs/architecture.md, "quarantine").  ``__init__`` looks the hooks up as module
globals, so operators built before :func:`install` keep Data-Juicer's wrappers.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

from data_juicer_elastic.compat import (
    ALREADY,
    APPLIED,
    dj_moved,
    import_target,
    is_installed,
    target_function,
    wrap_function,
)

MODULE: Final = "data_juicer.ops.base_op"
BATCHES: Final = "catch_map_batches_exception"
SINGLE: Final = "catch_map_single_exception"
TARGET: Final = f"{MODULE}.{BATCHES} / {SINGLE}"
# The parameters each hook is called with (checked by self_check: a renamed one moves the hook).
PARAMETERS: Final = {
    BATCHES: ("method", "skip_op_error", "op_name"),
    SINGLE: ("method", "return_sample", "skip_op_error", "op_name"),
}


@dataclass(frozen=True)
class HookCall:
    """One call of a hook: what the operator's ``__init__`` asked to be wrapped."""

    batched: bool  # catch_map_batches_exception (True) or catch_map_single_exception
    method: Callable[..., Any]  # the operator's bound method (process_batched, compute_stats_single, ...)
    skip_op_error: bool
    op_name: str | None
    return_sample: bool = True  # single only: False for a Filter's keep decision

    @property
    def keep_decision(self) -> bool:
        """True when the method is a Filter's keep decision (``process_batched`` /
        ``process_single`` of a Filter): it returns booleans, one per row, not rows."""
        filter_class = getattr(sys.modules.get(MODULE), "Filter", None)
        op = getattr(self.method, "__self__", None)
        name = getattr(self.method, "__name__", "")
        return filter_class is not None and isinstance(op, filter_class) and name.startswith("process_")


Wrap = Callable[[Callable[..., Any], HookCall], Callable[..., Any]]


def install(module: ModuleType, wrap: Wrap) -> None:
    """Replace both hooks of ``module`` (idempotent): each builds Data-Juicer's wrapper, then returns
    ``wrap(built, HookCall(...))``.  AttributeError naming the hook when one is missing."""
    for name in (BATCHES, SINGLE):
        if wrap_function(module, name, functools.partial(_hook, name, wrap=wrap)) not in (APPLIED, ALREADY):
            raise AttributeError(f"{MODULE}.{name} not found")


def _hook(name: str, original: Callable[..., Any], wrap: Wrap) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def hook(*args: Any, **kwargs: Any) -> Any:
        built = original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        call = HookCall(
            batched=name == BATCHES,
            method=values["method"],
            skip_op_error=bool(values["skip_op_error"]),
            op_name=values["op_name"],
            return_sample=bool(values.get("return_sample", True)),
        )
        return wrap(built, call)

    return hook


def installed(module: ModuleType) -> bool:
    return all(is_installed(getattr(module, name, None)) for name in (BATCHES, SINGLE))


def self_check() -> str:
    module = import_target(MODULE, where=TARGET)
    for name, expected in PARAMETERS.items():
        target_function(MODULE, name, parameters=expected)
    for cls, wrapped in (("Mapper", ("process",)), ("Filter", ("process", "compute_stats"))):
        source = inspect.getsource(getattr(module, cls).__init__)
        if BATCHES not in source or SINGLE not in source:
            raise dj_moved(f"{MODULE}.{cls}.__init__ no longer wraps {'/'.join(wrapped)} with the hooks", where=TARGET)
    return f"{TARGET}: found{' (wrapped)' if installed(module) else ''}"
