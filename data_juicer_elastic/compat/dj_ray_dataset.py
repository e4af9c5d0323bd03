"""py-data-juicer 1.6.1: ``data_juicer.core.data.ray_dataset.RayDataset.read`` (a classmethod, the one
call its Ray load strategy makes for a local JSONL path), swapped while a shard runs so that
Data-Juicer gets the shard as this package read it (``execution.shard_reader``); no hook exists.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved

MODULE: Final = "data_juicer.core.data.ray_dataset"
TARGET: Final = f"{MODULE}.RayDataset.read"


def ray_dataset_class() -> Any:
    try:
        from data_juicer.core.data.ray_dataset import RayDataset
    except ImportError as exc:
        raise dj_moved(f"cannot import {MODULE}.RayDataset: {exc}") from exc
    return RayDataset


def read_method() -> classmethod:
    """``RayDataset.read`` as found on the class (a classmethod), or IntegrationError."""
    found = inspect.getattr_static(ray_dataset_class(), "read", None)
    if not isinstance(found, classmethod):
        raise dj_moved(f"{TARGET} is missing or no longer a classmethod")
    return found


def replace_read(read: Callable[..., Any]) -> classmethod:
    """Make ``RayDataset.read`` call ``read(cls, data_format, paths, **kwargs)``; returns the
    original, for :func:`restore_read`."""
    original = read_method()
    ray_dataset_class().read = classmethod(functools.wraps(original.__func__)(read))
    return original


def restore_read(original: classmethod) -> None:
    ray_dataset_class().read = original


def self_check() -> str:
    read = read_method().__func__
    parameters = tuple(inspect.signature(read).parameters)
    if parameters[:3] != ("cls", "data_format", "paths"):
        raise dj_moved(f"{TARGET} no longer takes (data_format, paths): {parameters}")
    return f"{TARGET}: classmethod (data_format, paths, ...) found"
