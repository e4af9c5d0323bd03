"""py-data-juicer 1.6.1: ``data_juicer.ops.op_fusion.fuse_operators(ops, probe_res=None,
mapper_fusion=True, mapper_fusion_vram_limit=0.9)``, the operator fusion ``RayExecutor.run``
applies (``data_juicer.ops`` does not export it).

Why.  Stage identities are computed on the operator list as ``RayExecutor.run`` prepares it
(``execution.stage_identities``): with ``op_fusion: true`` that is the fused one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved, target_function

MODULE: Final = "data_juicer.ops.op_fusion"
TARGET: Final = f"{MODULE}.fuse_operators"
KEYWORDS: Final = ("mapper_fusion", "mapper_fusion_vram_limit")


def _fuse_operators() -> Callable[..., Any]:
    found = target_function(MODULE, "fuse_operators", why=": a recipe with op_fusion cannot be prepared")
    parameters = inspect.signature(found).parameters
    missing = [name for name in KEYWORDS if name not in parameters]
    if missing:
        raise dj_moved(f"{TARGET} no longer takes {', '.join(missing)}: {tuple(parameters)}", where=TARGET)
    return found


def fused(ops: Sequence[Any], *, mapper_fusion: bool, mapper_fusion_vram_limit: float) -> list[Any]:
    """``ops`` fused as ``RayExecutor.run`` fuses them."""
    return _fuse_operators()(ops, mapper_fusion=mapper_fusion, mapper_fusion_vram_limit=mapper_fusion_vram_limit)


def self_check() -> str:
    _fuse_operators()
    return f"{TARGET}(ops, {', '.join(KEYWORDS)}) found"
