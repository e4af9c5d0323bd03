"""Run a callback once a module has *finished* executing, however far its import is (target: CPython's
importlib, ``ModuleSpec._initializing`` (3.11-3.13) and the ``setattr(parent, child, module)`` it
does once a submodule finished; :func:`check_importlib_deferred` checks both on a probe).

Data-Juicer imports its operator plugins (our entry point) from ``data_juicer.ops``, which
``data_juicer.config.config`` imports at its top, so a module the plugin patches is either
complete (in ``sys.modules``, not initialising: patch now), in flight (``__spec__._initializing``:
the parent's ``__class__`` is switched to a ``ModuleType`` subclass whose ``__setattr__`` sees
importlib bind the finished child), or not imported yet (a meta-path finder finds the spec through
the other finders and wraps that loader's ``exec_module``).  Callbacks run at most once per module
name; an exception in one never breaks the import that triggered it: it goes to ``on_error``.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from importlib.abc import MetaPathFinder
from pathlib import Path
from types import ModuleType

from data_juicer_elastic.errors import IntegrationError

Callback = Callable[[ModuleType], None]
ErrorHandler = Callable[[str, BaseException], None]

_lock = threading.RLock()
_pending: dict[str, list[tuple[Callback, ErrorHandler | None]]] = {}
_finder: _DeferredFinder | None = None


def when_imported(name: str, callback: Callback, on_error: ErrorHandler | None = None) -> str:
    """Call ``callback(module)`` once ``name`` has finished executing; how it was arranged:
    ``"now"``, ``"in-flight"`` or ``"on-import"``."""
    with _lock:
        module = sys.modules.get(name)
        if module is not None and not _initializing(module):
            _run(name, module, [(callback, on_error)])
            return "now"
        _pending.setdefault(name, []).append((callback, on_error))
        if module is not None:
            _watch_parent(name)
            return "in-flight"
        _ensure_finder()
        return "on-import"


def pending() -> list[str]:
    """Module names still waited for."""
    with _lock:
        return sorted(_pending)


def _initializing(module: ModuleType) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _pending.pop(name, [])
    _run(name, module, callbacks)


def _run(name: str, module: ModuleType, callbacks: list[tuple[Callback, ErrorHandler | None]]) -> None:
    for callback, on_error in callbacks:
        try:
            callback(module)
        except Exception as exc:  # a plugin problem must never break Data-Juicer's own import
            if on_error is not None:
                on_error(name, exc)
            else:
                warnings.warn(f"data-juicer-elastic: deferred patch of {name} failed: {exc!r}", stacklevel=2)


def _watch_parent(name: str) -> None:
    parent_name, _, _child = name.rpartition(".")
    parent = sys.modules.get(parent_name) if parent_name else None
    if parent is None:
        # A top-level module in flight has no parent to watch; it stays pending
        # (doctor reports it) rather than being guessed at.
        return
    base = type(parent)
    if getattr(base, "_dj_elastic_watcher", False):
        return

    def __setattr__(self, attr, value):  # noqa: N807 - the hook importlib triggers
        base.__setattr__(self, attr, value)
        full = f"{self.__name__}.{attr}"
        if isinstance(value, ModuleType) and full in _pending and sys.modules.get(full) is value:
            _fire(full, value)
        prefix = self.__name__ + "."
        if not any(p.rpartition(".")[0] == self.__name__ for p in _pending if p.startswith(prefix)):
            base.__setattr__(self, "__class__", base)

    watcher = type(f"_DjElasticWatched{base.__name__}", (base,), {"__setattr__": __setattr__})
    watcher._dj_elastic_watcher = True
    try:
        parent.__class__ = watcher
    except TypeError:
        # A parent that refuses __class__ assignment: fall back to the finder,
        # which still catches a later (re-)import of the child.
        _ensure_finder()


class _DeferredFinder(MetaPathFinder):
    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(self, fullname, path, target=None):
        busy = self._busy.__dict__.setdefault("names", set())
        if fullname not in _pending or fullname in busy:
            # A finder we delegate to may ask the whole meta path again.
            return None
        busy.add(fullname)
        try:
            spec = _find_with_others(self, fullname, path, target)
        finally:
            busy.discard(fullname)
        if spec is None:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            original(module)
            if module.__name__ == fullname:
                _restore(loader, original)
                _fire(fullname, module)

        try:
            # An instance attribute shadows the class's method for this loader
            # only; isinstance checks, get_source and tracebacks are unchanged.
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            with _lock:  # the parent is imported before the child, so it is in sys.modules now
                _watch_parent(fullname)
        return spec


def _find_with_others(me, fullname, path, target):
    finders = [f for f in sys.meta_path if f is not me and getattr(f, "find_spec", None) is not None]
    return next((spec for f in finders if (spec := f.find_spec(fullname, path, target)) is not None), None)


def _restore(loader, original) -> None:
    try:
        if loader.__dict__.get("exec_module") is not None:
            del loader.exec_module
    except (AttributeError, TypeError):
        loader.exec_module = original


def _ensure_finder() -> None:
    global _finder
    _finder = _finder or _DeferredFinder()
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def check_importlib_deferred() -> str:
    """Import a probe package whose submodule records ``__spec__._initializing`` while it runs,
    and check importlib then sets the submodule on its package (what ``_watch_parent`` needs)."""
    package = f"dj_elastic_probe_{threading.get_ident()}"
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, package).mkdir()
        Path(folder, package, "__init__.py").write_text("")
        Path(folder, package, "child.py").write_text("SEEN = bool(getattr(__spec__, '_initializing', False))\n")
        sys.path.insert(0, folder)
        importlib.invalidate_caches()
        try:
            child = importlib.import_module(f"{package}.child")
            parent_sees_child = getattr(sys.modules[package], "child", None) is child
        finally:
            sys.path.remove(folder)
            for name in (f"{package}.child", package):
                sys.modules.pop(name, None)
    if not (child.SEEN and parent_sees_child):
        raise IntegrationError(
            "importlib no longer marks a module's spec _initializing while it runs"
            if not child.SEEN
            else "importlib no longer sets a finished submodule on its package",
            where=f"Python {sys.version.split()[0]}",
            hint="run the plugin on Python 3.11-3.13, or report this Python version",
        )
    return f"found ModuleSpec._initializing and submodule binding (Python {sys.version.split()[0]})"
