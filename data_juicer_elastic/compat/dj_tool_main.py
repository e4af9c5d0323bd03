"""py-data-juicer 1.6.1: ``data_juicer.tools.process_data.main`` / ``analyze_data.main`` (wrapped),
and each tool module's global ``init_configs``, swapped for the length of a call: ``main`` looks it
up when it parses, and seeing the parsed cfg leave it is the only way to send ``elastic_sharded``
past ``main``'s hard-coded ``if/elif`` without copying ``main`` (``integration.dispatch``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved, import_target, wrap_function

PROCESS_MODULE: Final = "data_juicer.tools.process_data"
ANALYZE_MODULE: Final = "data_juicer.tools.analyze_data"


def _problem(module: ModuleType) -> str | None:
    """Why ``module.main`` cannot be wrapped (None when it can)."""
    if not callable(getattr(module, "main", None)):
        return "function not found"
    if not callable(getattr(module, "init_configs", None)):
        return "its module no longer calls a module-level init_configs"
    return None


def wrap_main(module: ModuleType, call: Callable[[Any, tuple, dict], Any]) -> str:
    """Make ``module.main(*args, **kwargs)`` run ``call(original main, args, kwargs)``:
    :data:`APPLIED`, :data:`ALREADY`, or why the target is missing."""

    def make(original):
        def main(*args, **kwargs):
            return call(original, args, kwargs)

        return main

    return _problem(module) or wrap_function(module, "main", make)


@contextlib.contextmanager
def init_configs_replaced(module: ModuleType, make: Callable[[Any], Any]) -> Iterator[None]:
    """While entered, the tool module's ``init_configs`` is ``make(the real one)``."""
    real = module.init_configs
    replacement = make(real)
    module.init_configs = replacement
    try:
        yield
    finally:
        if module.init_configs is replacement:
            module.init_configs = real


def self_check() -> str:
    for name in (PROCESS_MODULE, ANALYZE_MODULE):
        missing = _problem(import_target(name, where=f"{name}.main"))
        if missing is not None:
            raise dj_moved(f"{name}.main: {missing}", where=f"{name}.main")
    return f"{PROCESS_MODULE}.main and {ANALYZE_MODULE}.main with a module-level init_configs found"
