"""py-data-juicer 1.6.1: ``data_juicer.core.executor.ray_executor.RayExecutor.run(load_data_np=None,
skip_export=False, skip_return=False)``, called with ``skip_export=True``: a shard runs through
Data-Juicer's own ``RayExecutor``, but this package writes its rows (docs/lossless.md).
"""

from __future__ import annotations

import inspect
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved, import_target

MODULE: Final = "data_juicer.core.executor.ray_executor"
TARGET: Final = f"{MODULE}.RayExecutor.run"
# keyword -> the default it must have (so that leaving it out keeps the dataset coming back)
KEYWORDS: Final = {"skip_export": False, "skip_return": False}


def _executor_class() -> Any:
    executor = getattr(import_target(MODULE, where=TARGET), "RayExecutor", None)
    run = getattr(executor, "run", None)
    if not callable(run):
        raise dj_moved(f"{TARGET} is missing", where=TARGET)
    parameters = inspect.signature(run).parameters
    for name, default in KEYWORDS.items():
        if name not in parameters or parameters[name].default is not default:
            raise dj_moved(f"{TARGET} no longer takes {name}={default}: {tuple(parameters)}", where=TARGET)
    return executor


def run_unexported(cfg: Any) -> Any:
    """``RayExecutor(cfg).run(skip_export=True)``: the processed dataset, nothing exported."""
    return _executor_class()(cfg).run(skip_export=True)


def self_check() -> str:
    _executor_class()
    return f"{TARGET}({', '.join(f'{k}={v}' for k, v in KEYWORDS.items())}) found"
