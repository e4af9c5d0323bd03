"""Ray Data 2.60: concatenating blocks whose struct column has a field typed ``null`` in one block.

Target: ``ray.data._internal.arrow_ops.transform_pyarrow._backfill_missing_fields``.

The bug.  Ray converts what an operator returns (Python dicts) into Arrow per batch, so
a nested key that is null in every row of one batch gets Arrow type ``null`` there and a
real type (a struct) in another.  ``unify_schemas`` unifies the two correctly, but
``_backfill_missing_fields`` then recurses into the ``null``-typed field as if it were a
struct and raises ``TypeError: 'pyarrow.lib.DataType' object is not iterable``; the task
fails on every retry.  Any input whose nested objects gain a key in some region of the
rows hits it (e.g. ``meta`` with an extra sub-object in 40 rows); Data-Juicer's default
executor processes such input.

The fix: a column of type ``null`` is all nulls, so aligned to any struct type it is
``pa.nulls(len, that type)``; everything else goes to Ray's own function.  It is
installed in every Ray worker of a shard runtime (``worker_process_setup_hook``, see
``execution.shard_runner.shard_runtime_env``) and in the driver.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Final

from data_juicer_elastic.errors import IntegrationError

MODULE: Final = "ray.data._internal.arrow_ops.transform_pyarrow"
FUNCTION: Final = "_backfill_missing_fields"
TARGET: Final = f"{MODULE}.{FUNCTION}"
SETUP_HOOK: Final = f"{__name__}.install"
_PARAMETERS: Final = ("column", "unified_struct_type", "block_length")


def _target() -> tuple[Any, Any]:
    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:
        raise IntegrationError(
            f"cannot import {MODULE}: {exc}", where="ray", hint="install ray[data]>=2.60,<2.61"
        ) from exc
    function = getattr(module, FUNCTION, None)
    if function is None or tuple(inspect.signature(function).parameters) != _PARAMETERS:
        raise IntegrationError(
            f"{TARGET} is missing or changed its parameters (expected {', '.join(_PARAMETERS)})",
            where="ray",
            hint="install ray[data]>=2.60,<2.61",
        )
    return module, function


def self_check() -> str:
    """What ``dj-elastic doctor`` reports; IntegrationError when the target moved."""
    _target()
    return f"{TARGET} found"


def install() -> None:
    """Patch the target in this process (idempotent); the worker setup hook."""
    module, function = _target()
    if getattr(function, "__dj_elastic_fix__", False):
        return
    import pyarrow as pa

    @functools.wraps(function)
    def backfill(column: Any, unified_struct_type: Any, block_length: int) -> Any:
        if pa.types.is_null(column.type):
            return pa.nulls(len(column), type=unified_struct_type)
        return function(column=column, unified_struct_type=unified_struct_type, block_length=block_length)

    backfill.__dj_elastic_fix__ = True  # type: ignore[attr-defined]
    setattr(module, FUNCTION, backfill)  # Ray's recursion looks the name up in the module: it gets this one too
