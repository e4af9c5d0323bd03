"""py-data-juicer 1.6.1: how Data-Juicer computes a run's stage identities and where ``RayExecutor``
keeps them.

Targets: ``data_juicer.core.elasticjuicer.stage_identity.assign_stage_identities`` and
``operator_fingerprint``, and the private cfg field ``_resolved_stage_identities`` that
``RayExecutor.run`` reads (and, under ``elastic_juicer_adaptive_batching``, sets itself).

Why.  A shard run must use the stage identities this package computed and checked against the
job's (``execution.shard_runner``), and adaptive batching keys its size profiles by them.  There
is no fallback: identities computed any other way would not match, so a Data-Juicer without
these functions is refused, naming the missing one.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved, import_target

IDENTITY_MODULE: Final = "data_juicer.core.elasticjuicer.stage_identity"
FUNCTIONS: Final = ("assign_stage_identities", "operator_fingerprint")
MODULE: Final = "data_juicer.core.executor.ray_executor"
FIELD: Final = "_resolved_stage_identities"
TARGET: Final = f"{MODULE}.RayExecutor cfg.{FIELD}"


def _function(name: str) -> Callable[..., Any]:
    where = f"{IDENTITY_MODULE}.{name}"
    found = getattr(import_target(IDENTITY_MODULE, where=where), name, None)
    if not callable(found):
        raise dj_moved(f"{where} is missing: Data-Juicer's stage identities cannot be computed", where=where)
    return found


def check_identity_functions() -> None:
    """IntegrationError naming the first of :data:`FUNCTIONS` this Data-Juicer lacks."""
    for name in FUNCTIONS:
        _function(name)


def identity_manifest(ops: Sequence[Any]) -> dict[str, Any]:
    """Data-Juicer's identity manifest (schema_version, pipeline_fingerprint, stages) of ``ops``."""
    return _function("assign_stage_identities")(ops)


def op_fingerprint(op: Any) -> str:
    """Data-Juicer's fingerprint of one operator (class, name, constructor arguments but ``work_dir``)."""
    return _function("operator_fingerprint")(op)


def stamp(cfg: Any, manifest: Any) -> None:
    """Give RayExecutor these stage identities (a copy: it may change what it is given)."""
    setattr(cfg, FIELD, copy.deepcopy(manifest))


def stamped(cfg: Any) -> Any:
    """The stage identities on the cfg (None when none were stamped)."""
    return getattr(cfg, FIELD, None)


def self_check() -> str:
    check_identity_functions()
    try:
        from data_juicer.core.executor.ray_executor import RayExecutor
    except ImportError as exc:
        raise dj_moved(f"cannot import {MODULE}: {exc}", where=TARGET) from exc
    if FIELD not in inspect.getsource(RayExecutor):
        raise dj_moved(f"{MODULE}.RayExecutor no longer uses cfg.{FIELD}", where=TARGET)
    return f"{IDENTITY_MODULE}.{{{', '.join(FUNCTIONS)}}} found; {TARGET}: used by RayExecutor"
