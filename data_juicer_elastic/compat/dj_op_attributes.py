"""py-data-juicer 1.6.1: the private attributes of an operator (``data_juicer.ops.base_op.OP``), set by
``OP.__init__`` / the registry and read by Data-Juicer itself: ``_name``, ``_init_kwargs`` (what Ray
actors are rebuilt from and ``operator_fingerprint`` hashes), ``_op_cfg`` (the recipe entry), and
the class flags ``_batched_op`` and ``_supports_adaptive_batching``.  Warm operators re-base a
cached instance exactly where building it anew would (docs/warm-operators.md); adaptive batching
names, fingerprints and vets operators as Data-Juicer does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved

MODULE: Final = "data_juicer.ops.base_op"
TARGET: Final = f"{MODULE}.OP"
NAME: Final = "_name"
INIT_KWARGS: Final = "_init_kwargs"
OP_CFG: Final = "_op_cfg"
BATCHED_FLAG: Final = "_batched_op"
ADAPTIVE_FLAG: Final = "_supports_adaptive_batching"


def op_name(op: Any) -> str:
    """The registered name of an operator (instance or class), else its class name."""
    fallback = op.__name__ if isinstance(op, type) else type(op).__name__
    return getattr(op, NAME, None) or fallback


def rebase_op(op: Any, item: Any, per_attempt: Mapping[str, Any]) -> None:
    """Give a built operator the per-attempt arguments ``per_attempt`` of recipe entry ``item``,
    where Data-Juicer's constructor would have put them."""
    for name, value in per_attempt.items():
        setattr(op, name, value)
        init_kwargs = getattr(op, INIT_KWARGS, None)
        if isinstance(init_kwargs, Mapping) and name in init_kwargs:
            setattr(op, INIT_KWARGS, {**init_kwargs, name: value})
    setattr(op, OP_CFG, item)


def is_batched_class(cls: type) -> bool:
    return bool(getattr(cls, BATCHED_FLAG, False))


def supports_adaptive_batching(cls: type) -> bool:
    return bool(getattr(cls, ADAPTIVE_FLAG, False))


def self_check() -> str:
    try:
        from data_juicer.ops import load_ops
        from data_juicer.ops.base_op import OP, Mapper
    except ImportError as exc:
        raise dj_moved(f"cannot import {MODULE}: {exc}", where=TARGET) from exc
    work_dir = "/nonexistent/dj-elastic-doctor"
    item = {"whitespace_normalization_mapper": {"work_dir": work_dir}}
    (op,) = load_ops([item])
    if op_name(op) != "whitespace_normalization_mapper" or getattr(op, OP_CFG, None) != item:
        raise dj_moved(f"{TARGET} built by load_ops no longer carries {NAME} and {OP_CFG}", where=TARGET)
    if (getattr(op, INIT_KWARGS, None) or {}).get("work_dir") != work_dir:
        raise dj_moved(f"{TARGET} no longer keeps its constructor arguments in {INIT_KWARGS}", where=TARGET)
    for flag, owner in ((BATCHED_FLAG, OP), (ADAPTIVE_FLAG, Mapper)):
        if flag not in vars(owner):
            raise dj_moved(f"{owner.__module__}.{owner.__name__} no longer has the class flag {flag}", where=TARGET)
    return f"{TARGET}: {NAME}, {INIT_KWARGS}, {OP_CFG}, {BATCHED_FLAG}, {ADAPTIVE_FLAG} found"
