"""py-data-juicer 1.6.1: ``data_juicer.utils.resource_utils.check_and_initialize_ray``, kept off while
a recipe is parsed: with ``RAY_JOB=1`` the resource probes (``cpu_count`` in ``init_configs``) call
``ray.init(cfg.ray_address)``, attaching to any runtime on the node, which a worker parsing a shard
recipe must not.  Only the CPU count changes (it clamps ``np``, never a Ray operator's arguments).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Final

from data_juicer_elastic.compat import dj_moved, import_target

MODULE: Final = "data_juicer.utils.resource_utils"
TARGET: Final = f"{MODULE}.check_and_initialize_ray"
_NO_RAY_LOCK = threading.Lock()


def _resource_utils() -> Any:
    resource_utils = import_target(MODULE, where=TARGET)
    if getattr(resource_utils, "check_and_initialize_ray", None) is None:
        raise dj_moved(f"{TARGET} is missing")
    return resource_utils


@contextlib.contextmanager
def no_ray_start() -> Iterator[None]:
    """Keep Data-Juicer's resource probes (``cpu_count`` in init_configs) off Ray."""
    resource_utils = _resource_utils()
    original = resource_utils.check_and_initialize_ray
    with _NO_RAY_LOCK:
        resource_utils.check_and_initialize_ray = lambda cfg=None: False
        try:
            yield
        finally:
            resource_utils.check_and_initialize_ray = original


def self_check() -> str:
    _resource_utils()
    return f"{TARGET}: found"
