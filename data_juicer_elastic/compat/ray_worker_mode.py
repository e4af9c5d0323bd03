"""Ray 2.60: is this process a Ray worker?  ``ray._private.worker.global_worker.mode`` against
``WORKER_MODE``, read from ``sys.modules`` only (a process without Ray is no Ray worker, and this
must not import it): a quiet elastic job silences Data-Juicer's INFO lines in its Ray workers only.
"""

from __future__ import annotations

import sys
from typing import Final

from data_juicer_elastic.compat import import_target, ray_moved

MODULE: Final = "ray._private.worker"
TARGET: Final = f"{MODULE}.global_worker.mode"


def is_ray_worker() -> bool:
    """True in a Ray worker process; False in a driver and where Ray was never imported."""
    worker = getattr(getattr(sys.modules.get("ray"), "_private", None), "worker", None)
    return getattr(getattr(worker, "global_worker", None), "mode", None) == getattr(worker, "WORKER_MODE", object())


def self_check() -> str:
    worker = import_target(MODULE, where="ray")
    if not hasattr(worker, "WORKER_MODE") or not hasattr(getattr(worker, "global_worker", None), "mode"):
        raise ray_moved(f"{TARGET} or {MODULE}.WORKER_MODE is missing", where=TARGET)
    if is_ray_worker():
        raise ray_moved(f"{TARGET}: this driver process reads as a Ray worker", where=TARGET)
    return f"{TARGET} and WORKER_MODE found"
