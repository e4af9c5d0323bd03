"""Recipe opt-in: ``adaptive_batching: true`` on a registered Mapper applies :class:`AdaptiveBatchingMixin`
under every executor.  Through Data-Juicer's operator metaclass (``compat.dj_ops_internals``), building an
opted-in class gives an ``Adaptive<Class>`` = ``(AdaptiveBatchingMixin, Class)`` instance, created once
per class and reachable by name (PEP 562), so pickles send it by reference.  Rules and refusals:
docs/adaptive-batching.md.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any, Final

from data_juicer_elastic.batching.mixin import HOOKS, AdaptiveBatchingMixin, adaptive_requested, check_settings
from data_juicer_elastic.compat.dj_ops_internals import is_batched_class, op_name
from data_juicer_elastic.errors import ConfigError

ENV_SWITCH: Final = "DJ_ELASTIC_ADAPTIVE_BATCHING"
_PREFIX: Final = "Adaptive"

_lock = threading.Lock()
_classes: dict[type, type] = {}


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "on").strip().lower() not in ("0", "off", "false", "no")


def adaptive_class(cls: type) -> type:
    """``(AdaptiveBatchingMixin, cls)``, created once; ``cls`` itself when it has the mixin already."""
    if issubclass(cls, AdaptiveBatchingMixin):
        return cls
    with _lock:
        found = _classes.get(cls)
        if found is None:
            # Adaptive<Name>_<hex of module:qualname>: an identifier that names its base class
            name = f"{_PREFIX}{cls.__name__}_{f'{cls.__module__}:{cls.__qualname__}'.encode().hex()}"
            found = type(cls)(
                name,
                (AdaptiveBatchingMixin, cls),
                {
                    "__module__": __name__,
                    "__qualname__": name,
                    "__doc__": f"{cls.__qualname__} with adaptive micro-batching (data-juicer-elastic).",
                    "_adaptive_base": cls,
                    **_operator_hooks(cls),
                },
            )
            _classes[cls] = found
            globals()[name] = found
    return found


def _operator_hooks(cls: type) -> dict[str, Any]:
    """The mixin hooks ``cls`` (which has no mixin in its bases) defines, as raw class attributes
    (staticmethod/classmethod/property keep their kind)."""
    owners = {name: next((klass for klass in cls.__mro__ if name in vars(klass)), None) for name in HOOKS}
    return {name: vars(owner)[name] for name, owner in owners.items() if owner is not None}


def __getattr__(name: str) -> Any:  # PEP 562: unpickling an Adaptive class in a fresh process
    if name.startswith(_PREFIX) and "_" in name:
        try:
            module_name, _, qualname = bytes.fromhex(name.rsplit("_", 1)[1]).decode().partition(":")
        except ValueError:
            raise AttributeError(name) from None
        base: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            base = getattr(base, part)
        cls = adaptive_class(base)
        if cls.__name__ == name:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve(cls: type, requested: Any) -> type:
    """The class to instantiate for ``cls`` with the recipe's ``adaptive_batching`` value."""
    if issubclass(cls, AdaptiveBatchingMixin) or not enabled():
        return cls
    if not adaptive_requested(cls, requested if isinstance(requested, bool) else None):
        return cls
    check_settings(cls, op_name(cls))
    return adaptive_class(cls)


def check_config(cfg: Any) -> None:
    """Refuse recipes whose opted-in operators cannot be micro-batched (ConfigError naming the op)."""
    if not enabled():
        return
    process = _get(cfg, "process") or []
    try:
        from data_juicer.ops.base_op import OPERATORS
    except ImportError:  # pragma: no cover - Data-Juicer moved it; construction still checks
        return
    opted: list[tuple[int, str, type, dict]] = []
    for position, entry in enumerate(process):
        if not isinstance(entry, dict) or len(entry) != 1:
            continue
        name, args = next(iter(entry.items()))
        cls = OPERATORS.modules.get(name)
        args = args if isinstance(args, dict) else {}
        requested = args.get("adaptive_batching")
        if cls is not None and adaptive_requested(cls, requested if isinstance(requested, bool) else None):
            opted.append((position, name, cls, args))
    if not opted:
        return
    names = ", ".join(name for _, name, _, _ in opted)
    if _get(cfg, "elastic_juicer_adaptive_batching"):
        raise ConfigError(
            f"operator(s) {names} opt into adaptive batching, which data-juicer-elastic applies itself; "
            "elastic_juicer_adaptive_batching: true would wrap them a second time with Data-Juicer's controller",
            where=f"{opted[0][1]}.adaptive_batching",
            hint="remove elastic_juicer_adaptive_batching (recommended), or set the environment variable "
            f"{ENV_SWITCH}=off to use Data-Juicer's built-in controller instead",
        )
    if _get(cfg, "op_fusion"):
        raise ConfigError(
            f"adaptive batching cannot micro-batch fused operators ({names} opted in)",
            where="op_fusion",
            hint="set op_fusion: false, or turn adaptive_batching off",
        )
    for position, name, cls, args in opted:
        batched = is_batched_class(cls) or bool(args.get("batch_mode"))  # as Data-Juicer's OP.is_batched_op
        check_settings(cls, name, batched=batched, num_gpus=args.get("num_gpus"), position=position)


def _get(cfg: Any, key: str) -> Any:
    getter = getattr(cfg, "get", None)
    return getter(key, None) if callable(getter) else getattr(cfg, key, None)
