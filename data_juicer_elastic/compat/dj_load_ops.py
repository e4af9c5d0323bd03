"""py-data-juicer 1.6.1: the module globals ``load_ops`` (in ``data_juicer.ops`` and
``data_juicer.core.executor.ray_executor``, which ``RayExecutor.run`` calls) and
``data_juicer.utils.process_utils.calculate_ray_np`` (imported by ``RayDataset.process`` on every
call), swapped per shard run: warm operators keep a recipe's operators and their resource plan
across shards (docs/warm-operators.md); Data-Juicer builds and sizes them anew and has no hook.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved, import_target

LOAD_OPS_MODULES: Final = ("data_juicer.ops", "data_juicer.core.executor.ray_executor")
PLANNER_MODULE: Final = "data_juicer.utils.process_utils"


def target_module(name: str, attribute: str) -> Any:
    """Module ``name`` with a callable global ``attribute``, or IntegrationError."""
    module = import_target(name)
    if not callable(module.__dict__.get(attribute)):
        raise dj_moved(f"{name}.{attribute} is missing", also=", or set DJ_ELASTIC_WARM_OPERATORS=0")
    return module


@contextlib.contextmanager
def load_ops_replaced(load: Callable[..., Any], plan: Callable[..., Any]) -> Iterator[None]:
    """While entered, ``load_ops(process_list, op_env_manager=None)`` is ``load(original, process_list,
    op_env_manager)`` and ``calculate_ray_np(operators, ...)`` is ``plan(original, operators, ...)``."""
    targets = [(target_module(name, "load_ops"), "load_ops") for name in LOAD_OPS_MODULES]
    targets.append((target_module(PLANNER_MODULE, "calculate_ray_np"), "calculate_ray_np"))
    saved = [(module, name, module.__dict__[name]) for module, name in targets]
    original_load, original_plan = saved[0][2], saved[-1][2]

    def load_ops(process_list, op_env_manager=None):
        return load(original_load, process_list, op_env_manager)

    def calculate_ray_np(operators, *args, **kwargs):
        return plan(original_plan, operators, *args, **kwargs)

    load_ops.__wrapped__ = original_load
    calculate_ray_np.__wrapped__ = original_plan
    for module, name, _ in saved:
        setattr(module, name, calculate_ray_np if name == "calculate_ray_np" else load_ops)
    try:
        yield
    finally:
        for module, name, found in saved:
            setattr(module, name, found)


def self_check() -> str:
    for name in LOAD_OPS_MODULES:
        parameters = tuple(inspect.signature(target_module(name, "load_ops").load_ops).parameters)
        if parameters[:2] != ("process_list", "op_env_manager"):
            raise dj_moved(f"{name}.load_ops no longer takes (process_list, op_env_manager): {parameters}")
    target_module(PLANNER_MODULE, "calculate_ray_np")
    return f"load_ops in {', '.join(LOAD_OPS_MODULES)} and {PLANNER_MODULE}.calculate_ray_np found"
