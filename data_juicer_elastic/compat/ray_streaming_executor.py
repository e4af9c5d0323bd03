"""Ray Data 2.60: a running execution's live metrics, read from its executor thread
(``ray.data._internal.execution.streaming_executor.StreamingExecutor._topology``, each physical
operator's ``name``, ``has_completed()``, ``metrics.rows_task_outputs_generated``,
``metrics.rows_inputs_of_submitted_tasks`` and ``metrics._running_tasks``) for an attempt's live
progress (``execution.progress_source``), which turns itself off when these move.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Final

from data_juicer_elastic.compat import import_target, ray_moved

MODULE: Final = "ray.data._internal.execution.streaming_executor"
TARGET: Final = f"{MODULE}.StreamingExecutor._topology"


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


def self_check() -> str:
    module = import_target(MODULE, where="ray")
    executor = getattr(module, "StreamingExecutor", None)
    if not (isinstance(executor, type) and issubclass(executor, threading.Thread)):
        raise ray_moved(f"{MODULE}.StreamingExecutor is missing or no longer a thread", where=TARGET)
    if "_topology" not in inspect.getsource(executor.__init__):
        raise ray_moved(f"{TARGET} is no longer set by StreamingExecutor", where=TARGET)
    from ray.data._internal.execution.interfaces import PhysicalOperator
    from ray.data._internal.execution.interfaces.op_runtime_metrics import OpRuntimeMetrics

    fields = ("rows_task_outputs_generated", "rows_inputs_of_submitted_tasks")
    if not callable(getattr(PhysicalOperator, "has_completed", None)) or not all(
        hasattr(OpRuntimeMetrics, name) for name in fields
    ):
        raise ray_moved(f"Ray Data's PhysicalOperator.has_completed or metrics.{'/'.join(fields)} moved", where=TARGET)
    if "self._running_tasks" not in inspect.getsource(OpRuntimeMetrics.__init__):
        raise ray_moved("Ray Data's OpRuntimeMetrics no longer keeps _running_tasks", where=TARGET)
    return (
        f"{TARGET}, PhysicalOperator.has_completed, metrics.rows_task_outputs_generated, "
        "rows_inputs_of_submitted_tasks and _running_tasks found"
    )
