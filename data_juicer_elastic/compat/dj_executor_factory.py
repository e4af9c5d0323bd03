"""py-data-juicer 1.6.1: ``ExecutorFactory.create_executor``, wrapped to build the elastic executor.

Target: ``data_juicer.core.executor.factory.ExecutorFactory.create_executor`` (a static or
class method taking the executor type first).

Why.  Code that asks Data-Juicer's factory for an executor by type (``dj-analyze``, user
scripts) must get ``ElasticShardedExecutor`` for ``elastic_sharded``; the factory has a fixed
``if/elif`` and no registry.
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


def _raw_method(module: ModuleType) -> tuple[Any, Any]:
    factory = getattr(module, "ExecutorFactory", None)
    return factory, inspect.getattr_static(factory, "create_executor", None) if factory is not None else None


def _problem(module: ModuleType) -> str | None:
    """Why the target cannot be wrapped (None when it can)."""
    _, raw = _raw_method(module)
    if not isinstance(raw, (staticmethod, classmethod)):
        return "not found" if raw is None else "no longer a static/class method"
    return None


def wrap_create_executor(module: ModuleType, intercept: Callable[[Any], Any]) -> str:
    """``create_executor`` returns ``intercept(executor_type)`` when that is not None, else what
    Data-Juicer's returns; :data:`APPLIED`, :data:`ALREADY` or why the target is missing."""
    missing = _problem(module)
    if missing is not None:
        return missing
    factory, raw = _raw_method(module)
    original = raw.__func__
    if is_installed(original):
        return ALREADY
    is_static = isinstance(raw, staticmethod)

    @functools.wraps(original)
    def create_executor(*args, **kwargs):
        positional = args if is_static else args[1:]
        executor_type = kwargs.get("executor_type", positional[0] if positional else None)
        executor = intercept(executor_type)
        if executor is not None:
            return executor
        return original(*args, **kwargs)

    setattr(create_executor, ORIGINAL, original)
    factory.create_executor = staticmethod(create_executor) if is_static else classmethod(create_executor)
    return APPLIED


def self_check() -> str:
    module = import_target(MODULE, where=TARGET)
    missing = _problem(module)
    if missing is not None:
        raise dj_moved(f"{TARGET}: {missing}", where=TARGET)
    return f"{TARGET}: static/class method found"
