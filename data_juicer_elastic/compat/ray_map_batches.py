"""Ray Data 2.60: ``ray.data.Dataset.map_batches`` (a plain function on the class taking
``fn_constructor_args``: how Data-Juicer's ``RayDataset._run_single_op`` hands an actor-mode operator
to an ``ActorPoolStrategy``), replaced while warm actors serve a shard (``execution.warm_ops``,
docs/warm-operators.md); neither Ray nor Data-Juicer has a hook for it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Final

from data_juicer_elastic.errors import IntegrationError

TARGET: Final = "ray.data.Dataset.map_batches"


def dataset_map_batches() -> tuple[type, Any]:
    """``(Dataset, Dataset.map_batches)`` as found on the class, or IntegrationError."""
    try:
        from ray.data import ActorPoolStrategy, Dataset  # noqa: F401 (both are relied on)
    except ImportError as exc:
        raise IntegrationError(f"cannot import ray.data: {exc}", where=TARGET) from exc
    original = inspect.getattr_static(Dataset, "map_batches", None)
    if not inspect.isfunction(original) or "fn_constructor_args" not in inspect.signature(original).parameters:
        raise IntegrationError(
            f"{TARGET} is missing or no longer takes fn_constructor_args",
            where=TARGET,
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


def self_check() -> str:
    dataset_map_batches()
    return f"{TARGET}: takes fn_constructor_args"
