"""py-data-juicer 1.6.1: ``data_juicer.core.executor.factory.ExecutorFactory.create_executor`` (a
static or class method taking the executor type first), wrapped so that it builds the elastic
executor for ``elastic_sharded`` (docs/architecture.md, "How does dj-process reach our executor?").
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from data_juicer_elastic.compat import ALREADY, APPLIED, ORIGINAL, dj_moved, import_target, is_installed

MODULE: Final = "data_juicer.core.executor.factory"
TARGET: Final = f"{MODULE}.ExecutorFactory.create_executor"


def _method(module: ModuleType) -> tuple[Any, Any, str | None]:
    """``(ExecutorFactory, its raw create_executor, why it cannot be wrapped or None)``."""
    factory = getattr(module, "ExecutorFactory", None)
    raw = inspect.getattr_static(factory, "create_executor", None) if factory is not None else None
    if not isinstance(raw, (staticmethod, classmethod)):
        return factory, raw, "not found" if raw is None else "no longer a static/class method"
    return factory, raw, None


def wrap_create_executor(module: ModuleType, intercept: Callable[[Any], Any]) -> str:
    """``create_executor`` returns ``intercept(executor_type)`` when that is not None, else what
    Data-Juicer's returns; :data:`APPLIED`, :data:`ALREADY` or why the target is missing."""
    factory, raw, missing = _method(module)
    if missing is not None:
        return missing
    original = raw.__func__
    if is_installed(original):
        return ALREADY
    is_static = isinstance(raw, staticmethod)

    @functools.wraps(original)
    def create_executor(*args, **kwargs):
        positional = args if is_static else args[1:]
        executor_type = kwargs.get("executor_type", positional[0] if positional else None)
        executor = intercept(executor_type)
        return original(*args, **kwargs) if executor is None else executor

    setattr(create_executor, ORIGINAL, original)
    factory.create_executor = staticmethod(create_executor) if is_static else classmethod(create_executor)
    return APPLIED


def self_check() -> str:
    missing = _method(import_target(MODULE, where=TARGET))[2]
    if missing is not None:
        raise dj_moved(f"{TARGET}: {missing}", where=TARGET)
    return f"{TARGET}: static/class method found"
