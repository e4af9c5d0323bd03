"""py-data-juicer 1.6.1: Data-Juicer's stage identities
(``data_juicer.core.elasticjuicer.stage_identity.assign_stage_identities``, ``operator_fingerprint``)
and the private cfg field ``_resolved_stage_identities`` that ``RayExecutor.run`` reads.

A shard run uses the identities this package computed and checked (``execution.shard_runner``).
No fallback: identities computed any other way would not match (docs/architecture.md, "compat").
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved, target_function

IDENTITY_MODULE: Final = "data_juicer.core.elasticjuicer.stage_identity"
FUNCTIONS: Final = ("assign_stage_identities", "operator_fingerprint")
MODULE: Final = "data_juicer.core.executor.ray_executor"
FIELD: Final = "_resolved_stage_identities"
TARGET: Final = f"{MODULE}.RayExecutor cfg.{FIELD}"


def _function(name: str) -> Callable[..., Any]:
    return target_function(IDENTITY_MODULE, name, why=": Data-Juicer's stage identities cannot be computed")


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
