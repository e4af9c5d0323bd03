"""py-data-juicer 1.6.1: where ``RayExecutor`` keeps a run's stage identities on its cfg.

Target: the private cfg field ``_resolved_stage_identities``, which
``data_juicer.core.executor.ray_executor.RayExecutor.run`` reads (and, under
``elastic_juicer_adaptive_batching``, sets itself from ``assign_stage_identities``).

Why.  A shard run must use the stage identities this package computed and checked against
the job's (``execution.shard_runner``): they are stamped on the cfg before the run and,
where RayExecutor recomputes them, compared after.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved

MODULE: Final = "data_juicer.core.executor.ray_executor"
FIELD: Final = "_resolved_stage_identities"
TARGET: Final = f"{MODULE}.RayExecutor cfg.{FIELD}"


def stamp(cfg: Any, manifest: Any) -> None:
    """Give RayExecutor these stage identities (a copy: it may change what it is given)."""
    setattr(cfg, FIELD, copy.deepcopy(manifest))


def stamped(cfg: Any) -> Any:
    """The stage identities on the cfg (None when none were stamped)."""
    return getattr(cfg, FIELD, None)


def self_check() -> str:
    try:
        from data_juicer.core.executor.ray_executor import RayExecutor
    except ImportError as exc:
        raise dj_moved(f"cannot import {MODULE}: {exc}", where=TARGET) from exc
    if FIELD not in inspect.getsource(RayExecutor):
        raise dj_moved(f"{MODULE}.RayExecutor no longer uses cfg.{FIELD}", where=TARGET)
    return f"{TARGET}: used by RayExecutor"
