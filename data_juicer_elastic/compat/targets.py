"""How a compat module reaches an engine's internal: imported, replaced once per process, or the one
IntegrationError naming what moved, with the supported range to install."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any, Final

from data_juicer_elastic import DATA_JUICER_REQUIREMENT
from data_juicer_elastic.errors import IntegrationError

# The Ray releases the Ray internals are written against (setup.cfg pins the same range).
RAY_REQUIREMENT: Final = "ray[data]>=2.60,<2.61"

# What a compat ``wrap_*`` returns when it replaced its target, or found it replaced already;
# anything else it returns says why the target is missing.
APPLIED: Final = "applied"
ALREADY: Final = "already installed"

# Marks a function the plugin installed in place of a Data-Juicer one; its value is the original.
ORIGINAL: Final = "__dj_elastic_original__"


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


def _moved(module_name: str) -> Callable[..., IntegrationError]:
    return ray_moved if module_name.split(".")[0] == "ray" else dj_moved


def import_target(module_name: str, *, where: str = "py-data-juicer") -> object:
    """``module_name`` imported, or :func:`dj_moved` / :func:`ray_moved` naming it."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise _moved(module_name)(f"cannot import {module_name}: {exc}", where=where) from exc


def target_function(module_name: str, name: str, *, parameters: tuple[str, ...] = (), why: str = "") -> Any:
    """``module_name.name`` as the engine defines it (the original, not a wrapper the plugin put in
    its place), once it is callable and its parameters start with ``parameters``; else the moved
    error naming it (``why``: what its absence breaks)."""
    target = f"{module_name}.{name}"
    found = getattr(import_target(module_name, where=target), name, None)
    found = getattr(found, ORIGINAL, found)
    if not callable(found):
        raise _moved(module_name)(f"{target} is missing{why}", where=target)
    taken = tuple(inspect.signature(found).parameters)
    if taken[: len(parameters)] != parameters:
        raise _moved(module_name)(f"{target} no longer takes ({', '.join(parameters)}): {taken}", where=target)
    return found
