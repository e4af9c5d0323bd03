"""Uses of Data-Juicer's and Ray's private internals (and of loguru's, jsonargparse's, ddsketch's
and importlib's), one module per target: each names it (``MODULE`` / ``TARGET``), checks it
(``self_check()``, run by ``dj-elastic doctor``) and fails with one IntegrationError naming it when
an upgrade moved it (docs/architecture.md, "compat").  Importing this package imports neither Ray
nor Data-Juicer: :func:`self_checks` imports each module only when it runs.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any, Final

from data_juicer_elastic import DATA_JUICER_REQUIREMENT
from data_juicer_elastic.errors import IntegrationError

__all__ = [
    "ALREADY",
    "APPLIED",
    "MODULES",
    "ORIGINAL",
    "RAY_REQUIREMENT",
    "dj_moved",
    "import_target",
    "is_installed",
    "ray_moved",
    "self_checks",
    "target_function",
    "wrap_function",
]

# The Ray releases the Ray internals below are written against (setup.cfg pins the same range).
RAY_REQUIREMENT: Final = "ray[data]>=2.60,<2.61"

# What a compat ``wrap_*`` returns when it replaced its target, or found it replaced already;
# anything else it returns says why the target is missing.
APPLIED: Final = "applied"
ALREADY: Final = "already installed"

# Marks a function the plugin installed in place of a Data-Juicer one; its value is the original.
ORIGINAL: Final = "__dj_elastic_original__"

# Every compat module, by name (``data_juicer_elastic.compat.<name>``), in ``dj-elastic doctor``'s
# order; each has a ``self_check`` and a test in tests/compat/test_<name>.py.
MODULES: Final = (
    ("ray_concat", "ray_map_batches", "ray_streaming_executor")
    + ("ray_services", "ray_global_node", "ray_sigterm_handler")
    + ("dj_ray_dataset", "dj_load_ops", "dj_op_attributes", "dj_op_metaclass", "dj_op_error_hooks", "dj_free_models")
    + ("dj_file_listing", "dj_resource_utils", "dj_stage_identities", "dj_op_fusion", "dj_ray_executor")
    + ("dj_config_module", "dj_tool_main", "dj_executor_factory")
    + ("jsonargparse_actions", "ddsketch_store", "importlib_deferred", "loguru_handlers", "loguru_file_sinks")
    + ("ray_worker_mode",)
)


def self_checks() -> list[tuple[str, str | BaseException]]:
    """``[(module name, its one-line "found ..." description or the error it raised)]``."""
    results: list[tuple[str, str | BaseException]] = []
    for name in MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
            results.append((name, module.self_check()))
        except Exception as exc:  # reported by doctor, never raised: every check must run
            results.append((name, exc))
    return results


def is_installed(function: object) -> bool:
    """True for a function the plugin installed (it carries :data:`ORIGINAL`)."""
    return getattr(function, ORIGINAL, None) is not None


def wrap_function(owner: Any, name: str, make: Callable[[Any], Any], missing: str = "function not found") -> str:
    """Replace ``owner.<name>`` with ``make(original)`` (given the original's name and docstring,
    marked :data:`ORIGINAL`); :data:`APPLIED`, :data:`ALREADY`, or ``missing`` when not callable."""
    original = getattr(owner, name, None)
    if not callable(original):
        return missing
    if is_installed(original):
        return ALREADY
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, ORIGINAL, original)
    setattr(owner, name, wrapper)
    return APPLIED


def dj_moved(message: str, *, where: str = "py-data-juicer", also: str = "") -> IntegrationError:
    """The error for a Data-Juicer internal that moved: install the supported Data-Juicer."""
    return IntegrationError(message, where=where, hint=f"install {DATA_JUICER_REQUIREMENT}{also}")


def ray_moved(message: str, *, where: str = "ray") -> IntegrationError:
    """The error for a Ray internal that moved: install the supported Ray."""
    return IntegrationError(message, where=where, hint=f"install {RAY_REQUIREMENT}")


def import_target(module_name: str, *, where: str = "py-data-juicer") -> object:
    """``module_name`` imported, or :func:`dj_moved` / :func:`ray_moved` naming it."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        moved = ray_moved if module_name.split(".")[0] == "ray" else dj_moved
        raise moved(f"cannot import {module_name}: {exc}", where=where) from exc


def target_function(module_name: str, name: str, *, parameters: tuple[str, ...] = (), why: str = "") -> Any:
    """``module_name.name`` as the engine defines it (the original, not a wrapper the plugin put in
    its place), once it is callable and its parameters start with ``parameters``; else the moved
    error naming it (``why``: what its absence breaks)."""
    target = f"{module_name}.{name}"
    found = getattr(import_target(module_name, where=target), name, None)
    found = getattr(found, ORIGINAL, found)
    moved = ray_moved if module_name.split(".")[0] == "ray" else dj_moved
    if not callable(found):
        raise moved(f"{target} is missing{why}", where=target)
    taken = tuple(inspect.signature(found).parameters)
    if taken[: len(parameters)] != parameters:
        raise moved(f"{target} no longer takes ({', '.join(parameters)}): {taken}", where=target)
    return found
