"""py-data-juicer 1.6.1: ``data_juicer.ops.base_op.OPMetaClass.__call__``, wrapped once per process
so that ``adaptive_batching: true`` gives an operator ``AdaptiveBatchingMixin`` however it is built
(``load_ops``, a Ray actor built from ``op.__class__``): it instantiates the class
``resolve(cls, adaptive_batching)`` picks (``batching.mixin``).  Data-Juicer has no construction hook.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from data_juicer_elastic.compat import ORIGINAL, dj_moved, import_target, is_installed

MODULE: Final = "data_juicer.ops.base_op"
TARGET: Final = f"{MODULE}.OPMetaClass.__call__"


def _metaclass_call(module: ModuleType) -> tuple[type | None, Any]:
    meta = getattr(module, "OPMetaClass", None)
    return (meta, meta.__dict__.get("__call__")) if isinstance(meta, type) else (None, None)


def install(module: ModuleType, resolve: Callable[[type, Any], type]) -> None:
    """Construct ``resolve(cls, kwargs.get("adaptive_batching"))`` instead of ``cls`` (idempotent)."""
    meta, original = _metaclass_call(module)
    if original is None:
        raise AttributeError(f"{TARGET} not found")
    if is_installed(original):
        return

    @functools.wraps(original)
    def __call__(cls, *args, **kwargs):  # noqa: N807 - the metaclass hook
        return original(resolve(cls, kwargs.get("adaptive_batching")), *args, **kwargs)

    setattr(__call__, ORIGINAL, original)
    meta.__call__ = __call__


def installed(module: ModuleType) -> bool:
    return is_installed(_metaclass_call(module)[1])


def self_check() -> str:
    module = import_target(MODULE, where=TARGET)
    if _metaclass_call(module)[1] is None:
        raise dj_moved(f"{TARGET} not found", where=TARGET)
    return f"{TARGET}: found{' (wrapped)' if installed(module) else ''}"
