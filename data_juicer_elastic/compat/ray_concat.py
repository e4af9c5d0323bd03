"""Ray Data 2.60: two fixes in ``ray.data._internal.arrow_ops.transform_pyarrow``
(``_backfill_missing_fields``, ``unify_schemas``), where Ray joins blocks it typed differently
from the same column (a map task building its output block, the driver iterating a dataset).

Each case fails on every retry although every value is fine, and the default executor processes
it (docs/lossless.md, "Ray Data block concatenation"): (1) a nested key null in every row of one
batch is typed ``null`` there, and the backfill recurses into it as if it were a struct: a
``null`` column is all nulls, so it becomes ``pa.nulls(len, struct type)``; (2) a column mixing
JSON types comes back ``int64`` from one batch and ``bool`` from another: before Ray unifies
schemas, a column Arrow cannot unify even permissively becomes a Python object column (Ray's
``ArrowPythonObjectType``).  Everything else goes to Ray's own functions.  Installed in every Ray
worker of a shard runtime (``worker_process_setup_hook``, ``execution.shard_runner``) and in the driver.
"""

from __future__ import annotations

import inspect
from typing import Any, Final

from data_juicer_elastic.compat import import_target, ray_moved, wrap_function

MODULE: Final = "ray.data._internal.arrow_ops.transform_pyarrow"
TARGETS: Final = {
    "_backfill_missing_fields": ("column", "unified_struct_type", "block_length"),
    "unify_schemas": ("schemas", "promote_types"),
}
SETUP_HOOK: Final = f"{__name__}.install"


def _targets() -> Any:
    """The target module, once each target takes the parameters the fixes rely on."""
    module = import_target(MODULE, where="ray")
    for name, parameters in TARGETS.items():
        function = getattr(module, name, None)
        if function is None or tuple(inspect.signature(function).parameters) != parameters:
            raise ray_moved(f"{MODULE}.{name} is missing or changed its parameters (expected {', '.join(parameters)})")
    return module


def self_check() -> str:
    _targets()
    return f"{MODULE}: {', '.join(TARGETS)} found"


def install() -> None:
    """Patch the targets in this process (idempotent); the worker setup hook."""
    module = _targets()
    import pyarrow as pa

    def fix_backfill(original: Any) -> Any:
        def backfill(column: Any, unified_struct_type: Any, block_length: int) -> Any:
            if pa.types.is_null(column.type):
                return pa.nulls(len(column), type=unified_struct_type)
            return original(column=column, unified_struct_type=unified_struct_type, block_length=block_length)

        return backfill

    def fix_unify(original: Any) -> Any:
        def unify(schemas: list[Any], *, promote_types: bool = False) -> Any:
            conflicting = _conflicting_fields(schemas)
            if conflicting:
                from ray.data.extensions import ArrowPythonObjectType

                objects = ArrowPythonObjectType()
                schemas = [
                    pa.schema([f.with_type(objects) if f.name in conflicting else f for f in s], metadata=s.metadata)
                    for s in schemas
                ]
            return original(schemas, promote_types=promote_types)

        return unify

    # Ray's own code looks these names up in the module at call time: it gets the fixed ones.
    wrap_function(module, "_backfill_missing_fields", fix_backfill)
    wrap_function(module, "unify_schemas", fix_unify)


def _conflicting_fields(schemas: list[Any]) -> set[str]:
    """Names of the fields whose native types across ``schemas`` Arrow cannot unify, even
    permissively (extension types are left to Ray, which makes a column with objects objects)."""
    import pyarrow as pa

    distinct = list({s.remove_metadata(): s for s in schemas})
    if len(distinct) < 2:
        return set()  # the common case, decided before looking at fields
    types: dict[str, list[Any]] = {}
    for schema in distinct:
        for f in schema:
            if f.type not in types.setdefault(f.name, []):
                types[f.name].append(f.type)
    conflicting = set()
    for name, seen in types.items():
        if len(seen) < 2 or any(isinstance(t, pa.ExtensionType) for t in seen):
            continue
        try:
            pa.unify_schemas([pa.schema([pa.field(name, t)]) for t in seen], promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            conflicting.add(name)
    return conflicting
