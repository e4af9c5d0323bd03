"""Ray's internals (Ray 2.60, Ray Data included): the local node and its processes, the SIGTERM
handler ``ray.init`` installs, a running execution's metrics, and two fixes in Ray Data's block
concatenation; Ray has no public handle for any of them.
"""

from __future__ import annotations

import contextlib
import inspect
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.compat.targets import (
    ALREADY,
    APPLIED,
    import_target,
    ray_moved,
    target_function,
    wrap_function,
)
from data_juicer_elastic.errors import IntegrationError

WORKER_MODULE: Final = "ray._private.worker"

# --- Two fixes in ``ray.data._internal.arrow_ops.transform_pyarrow`` (``_backfill_missing_fields``,
# ``unify_schemas``), where Ray joins blocks it typed differently from the same column (a map task
# building its output block, the driver iterating a dataset).  Each case fails on every retry
# although every value is fine, and the default executor processes it (docs/lossless.md, "Ray Data
# block concatenation"): (1) a nested key null in every row of one batch is typed ``null`` there, and
# the backfill recurses into it as if it were a struct: a ``null`` column is all nulls, so it becomes
# ``pa.nulls(len, struct type)``; (2) a column mixing JSON types comes back ``int64`` from one batch
# and ``bool`` from another: before Ray unifies schemas, a column Arrow cannot unify even permissively
# becomes a Python object column (Ray's ``ArrowPythonObjectType``).  Everything else goes to Ray's own
# functions.  Installed in every Ray worker of a shard runtime (``worker_process_setup_hook``,
# ``execution.shard_runner``) and in the driver.

CONCAT_MODULE: Final = "ray.data._internal.arrow_ops.transform_pyarrow"
CONCAT_TARGETS: Final = {
    "_backfill_missing_fields": ("column", "unified_struct_type", "block_length"),
    "unify_schemas": ("schemas", "promote_types"),
}
SETUP_HOOK: Final = f"{__name__}.install_concat_fixes"


def _concat_module() -> Any:
    """The target module, once each target takes the parameters the fixes rely on."""
    module = import_target(CONCAT_MODULE, where="ray")
    for name, parameters in CONCAT_TARGETS.items():
        function = getattr(module, name, None)
        if function is None or tuple(inspect.signature(function).parameters) != parameters:
            raise ray_moved(
                f"{CONCAT_MODULE}.{name} is missing or changed its parameters (expected {', '.join(parameters)})"
            )
    return module


def check_ray_concat() -> str:
    _concat_module()
    return f"{CONCAT_MODULE}: {', '.join(CONCAT_TARGETS)} found"


def install_concat_fixes() -> None:
    """Patch the targets in this process (idempotent); the worker setup hook."""
    module = _concat_module()
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


# --- The processes of the local Ray node this process started
# (``ray._private.worker._global_node.all_processes``): an unresponsive node-local runtime must be
# killed for good (``execution.ray_runtime``); ``ray.shutdown`` can hang on it.

GLOBAL_NODE: Final = f"{WORKER_MODULE}._global_node.all_processes"


def node_process_ids() -> list[int]:
    """The pids of the node processes (GCS, raylet, ...) this process started; [] when none."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    return [info.process.pid for infos in getattr(node, "all_processes", {}).values() for info in infos]


def check_ray_global_node() -> str:
    worker = import_target(WORKER_MODULE, where="ray")
    if not hasattr(worker, "_global_node"):
        raise ray_moved(f"{WORKER_MODULE}._global_node is missing", where=GLOBAL_NODE)
    from ray._private.node import Node

    if "all_processes" not in Node.__init__.__code__.co_names:
        raise ray_moved(f"{GLOBAL_NODE}: ray._private.node.Node no longer sets all_processes", where=GLOBAL_NODE)
    return f"{GLOBAL_NODE} found"


# --- Is this process a Ray worker?  ``ray._private.worker.global_worker.mode`` against
# ``WORKER_MODE``, read from ``sys.modules`` only (a process without Ray is no Ray worker, and this
# must not import it): a quiet elastic job silences Data-Juicer's INFO lines in its Ray workers only.

WORKER_MODE: Final = f"{WORKER_MODULE}.global_worker.mode"


def is_ray_worker() -> bool:
    """True in a Ray worker process; False in a driver and where Ray was never imported."""
    worker = getattr(getattr(sys.modules.get("ray"), "_private", None), "worker", None)
    return getattr(getattr(worker, "global_worker", None), "mode", None) == getattr(worker, "WORKER_MODE", object())


def check_ray_worker_mode() -> str:
    worker = import_target(WORKER_MODULE, where="ray")
    if not hasattr(worker, "WORKER_MODE") or not hasattr(getattr(worker, "global_worker", None), "mode"):
        raise ray_moved(f"{WORKER_MODE} or {WORKER_MODULE}.WORKER_MODE is missing", where=WORKER_MODE)
    if is_ray_worker():
        raise ray_moved(f"{WORKER_MODE}: this driver process reads as a Ray worker", where=WORKER_MODE)
    return f"{WORKER_MODE} and WORKER_MODE found"


# --- What ``ray.init("auto")`` would connect to, asked without connecting
# (``ray._private.services.canonicalize_bootstrap_address``, its cache ``find_gcs_addresses`` cleared
# first): ``ray_address: auto`` with no runtime on the node fails fast (``execution.ray_runtime``).

SERVICES_MODULE: Final = "ray._private.services"
SERVICES_FUNCTIONS: Final = ("canonicalize_bootstrap_address", "find_gcs_addresses")


def canonical_address(address: str) -> str | None:
    """The bootstrap address ``address`` (``"auto"``) resolves to; ConnectionError when no runtime
    runs; None when Ray's internals moved (the caller then lets ``ray.init`` tell)."""
    try:
        from ray._private import services
    except ImportError:  # pragma: no cover - Ray moved it
        return None
    try:
        services.find_gcs_addresses.cache_clear()
        return services.canonicalize_bootstrap_address(address)
    except AttributeError:  # pragma: no cover - Ray internals moved
        return None


def check_ray_services() -> str:
    services = import_target(SERVICES_MODULE, where="ray")
    missing = [name for name in SERVICES_FUNCTIONS if not callable(getattr(services, name, None))]
    if missing or not callable(getattr(services.find_gcs_addresses, "cache_clear", None)):
        raise ray_moved(
            f"{SERVICES_MODULE}: {', '.join(missing) or 'find_gcs_addresses.cache_clear'} missing",
            where=SERVICES_MODULE,
        )
    return f"{SERVICES_MODULE}: {', '.join(SERVICES_FUNCTIONS)} found"


# --- ``ray._private.utils.set_sigterm_handler``, which ``ray.init`` calls in the main thread every
# time (``sys.exit(signum)``) and ``ray._private.node.Node`` for a node it starts.  A worker's SIGTERM
# must reach its own handler (``jobdir.worker``: release the claims, die by the signal), but
# Data-Juicer's ``RayExecutor`` calls ``ray.init`` for every shard (docs/failure-semantics.md, row 26).
# :func:`keep_handlers` makes Ray leave a handler the plugin marks as its own, and install its own
# otherwise.

UTILS_MODULE: Final = "ray._private.utils"
SET_SIGTERM_HANDLER: Final = f"{UTILS_MODULE}.set_sigterm_handler"
SIGTERM_CALLERS: Final = ("ray._private.worker.init", "ray._private.node.Node._register_shutdown_hooks")

_keep: Callable[[Any], bool] | None = None  # which installed SIGTERM handlers Ray must leave in place


def keep_handlers(keep: Callable[[Any], bool]) -> str:
    """From now on in this process, Ray installs its SIGTERM handler only where the handler in
    place is not one ``keep(handler)`` claims.  ``APPLIED`` / ``ALREADY`` (the predicate is
    replaced either way)."""
    global _keep
    _keep = keep

    def make(original):
        def set_sigterm_handler(sigterm_handler):
            if _keep is not None and _keep(signal.getsignal(signal.SIGTERM)):
                logger.debug("Ray's SIGTERM handler not installed: the worker's own is in force")
                return None
            return original(sigterm_handler)

        return set_sigterm_handler

    outcome = wrap_function(import_target(UTILS_MODULE, where="ray"), "set_sigterm_handler", make)
    if outcome not in (APPLIED, ALREADY):
        raise ray_moved(f"{SET_SIGTERM_HANDLER} is missing", where=SET_SIGTERM_HANDLER)
    return outcome


def check_ray_sigterm_handler() -> str:
    target_function(UTILS_MODULE, "set_sigterm_handler")
    from ray._private import node, worker

    for caller, function in zip(SIGTERM_CALLERS, (worker.init, node.Node._register_shutdown_hooks), strict=True):
        if "set_sigterm_handler" not in inspect.unwrap(function).__code__.co_names:
            raise ray_moved(
                f"{caller} no longer installs its SIGTERM handler through {SET_SIGTERM_HANDLER}",
                where=SET_SIGTERM_HANDLER,
            )
    return f"{SET_SIGTERM_HANDLER} found (called by {', '.join(SIGTERM_CALLERS)})"


# --- Ray Data's map_batches: ``ray.data.Dataset.map_batches`` (a plain function on the class taking
# ``fn_constructor_args``: how Data-Juicer's ``RayDataset._run_single_op`` hands an actor-mode
# operator to an ``ActorPoolStrategy``), replaced while warm actors serve a shard
# (``execution.warm_ops``, docs/warm-operators.md); neither Ray nor Data-Juicer has a hook for it.

MAP_BATCHES: Final = "ray.data.Dataset.map_batches"


def dataset_map_batches() -> tuple[type, Any]:
    """``(Dataset, Dataset.map_batches)`` as found on the class, or IntegrationError."""
    try:
        from ray.data import ActorPoolStrategy, Dataset  # noqa: F401 (both are relied on)
    except ImportError as exc:
        raise IntegrationError(f"cannot import ray.data: {exc}", where=MAP_BATCHES) from exc
    original = inspect.getattr_static(Dataset, "map_batches", None)
    if not inspect.isfunction(original) or "fn_constructor_args" not in inspect.signature(original).parameters:
        raise IntegrationError(
            f"{MAP_BATCHES} is missing or no longer takes fn_constructor_args",
            where=MAP_BATCHES,
            hint="install the Ray version this package supports, or set DJ_ELASTIC_WARM_OPERATORS=0",
        )
    return Dataset, original


@contextlib.contextmanager
def map_batches_replaced(make: Callable[[Any], Any]) -> Iterator[None]:
    """While entered, ``Dataset.map_batches`` is ``make(original)``; the original after."""
    cls, original = dataset_map_batches()
    cls.map_batches = make(original)
    try:
        yield
    finally:
        cls.map_batches = original


def check_ray_map_batches() -> str:
    dataset_map_batches()
    return f"{MAP_BATCHES}: takes fn_constructor_args"


# --- A running execution's live metrics, read from its executor thread
# (``ray.data._internal.execution.streaming_executor.StreamingExecutor._topology``, each physical
# operator's ``name``, ``has_completed()``, ``metrics.rows_task_outputs_generated``,
# ``metrics.rows_inputs_of_submitted_tasks`` and ``metrics._running_tasks``) for an attempt's live
# progress (``execution.progress_source``), which turns itself off when these move.

STREAMING_MODULE: Final = "ray.data._internal.execution.streaming_executor"
TOPOLOGY: Final = f"{STREAMING_MODULE}.StreamingExecutor._topology"


def live_executors() -> list[Any]:
    """The StreamingExecutor threads of this process, oldest first."""
    from ray.data._internal.execution.streaming_executor import StreamingExecutor

    return [t for t in threading.enumerate() if isinstance(t, StreamingExecutor)]


def physical_operators(executor: Any) -> list[Any]:
    """The executor's physical operators in topology order, its input buffer left out."""
    topology = dict(getattr(executor, "_topology", None) or {})  # copy: the executor thread owns it
    return [op for op in topology if op.name != "Input"]


def has_completed(op: Any) -> bool:
    return bool(op.has_completed())


def rows_output(op: Any) -> int:
    """Rows the operator's tasks have produced so far (Ray counts them per finished block)."""
    return int(op.metrics.rows_task_outputs_generated or 0)


def rows_input_done(op: Any) -> int:
    """Input rows of the operator's finished tasks: rows handed to its tasks less those of the tasks
    still running.  Ray counts no such number itself; read on the sampler's thread while the
    executor's thread changes the running tasks, so a copy that races a change is taken again."""
    metrics = op.metrics
    for _ in range(5):
        try:
            submitted = int(metrics.rows_inputs_of_submitted_tasks or 0)
            running = sum(int(task.inputs.num_rows() or 0) for task in list(metrics._running_tasks.values()))
        except RuntimeError:  # "dictionary changed size during iteration": a task started or ended
            continue
        return max(0, submitted - running)
    return 0  # changing too fast to copy: no rows counted this sample (the next one counts them)


def check_ray_streaming_executor() -> str:
    module = import_target(STREAMING_MODULE, where="ray")
    executor = getattr(module, "StreamingExecutor", None)
    if not (isinstance(executor, type) and issubclass(executor, threading.Thread)):
        raise ray_moved(f"{STREAMING_MODULE}.StreamingExecutor is missing or no longer a thread", where=TOPOLOGY)
    if "_topology" not in inspect.getsource(executor.__init__):
        raise ray_moved(f"{TOPOLOGY} is no longer set by StreamingExecutor", where=TOPOLOGY)
    from ray.data._internal.execution.interfaces import PhysicalOperator
    from ray.data._internal.execution.interfaces.op_runtime_metrics import OpRuntimeMetrics

    fields = ("rows_task_outputs_generated", "rows_inputs_of_submitted_tasks")
    if not callable(getattr(PhysicalOperator, "has_completed", None)) or not all(
        hasattr(OpRuntimeMetrics, name) for name in fields
    ):
        raise ray_moved(
            f"Ray Data's PhysicalOperator.has_completed or metrics.{'/'.join(fields)} moved", where=TOPOLOGY
        )
    if "self._running_tasks" not in inspect.getsource(OpRuntimeMetrics.__init__):
        raise ray_moved("Ray Data's OpRuntimeMetrics no longer keeps _running_tasks", where=TOPOLOGY)
    return (
        f"{TOPOLOGY}, PhysicalOperator.has_completed, metrics.rows_task_outputs_generated, "
        "rows_inputs_of_submitted_tasks and _running_tasks found"
    )
