"""Ray 2.60: ``ray._private.utils.set_sigterm_handler``, which ``ray.init`` calls in the main thread
every time (``sys.exit(signum)``) and ``ray._private.node.Node`` for a node it starts.

A worker's SIGTERM must reach its own handler (``jobdir.worker``: release the claims, die
by the signal), but Data-Juicer's ``RayExecutor`` calls ``ray.init`` for every shard
(docs/failure-semantics.md, row 26).  :func:`keep_handlers` makes Ray leave a handler the plugin
marks as its own, and install its own otherwise.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.compat import ALREADY, APPLIED, import_target, ray_moved, target_function, wrap_function

MODULE: Final = "ray._private.utils"
TARGET: Final = f"{MODULE}.set_sigterm_handler"
CALLERS: Final = ("ray._private.worker.init", "ray._private.node.Node._register_shutdown_hooks")

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

    outcome = wrap_function(import_target(MODULE, where="ray"), "set_sigterm_handler", make)
    if outcome not in (APPLIED, ALREADY):
        raise ray_moved(f"{TARGET} is missing", where=TARGET)
    return outcome


def self_check() -> str:
    target_function(MODULE, "set_sigterm_handler")
    import inspect

    from ray._private import node, worker

    for caller, function in zip(CALLERS, (worker.init, node.Node._register_shutdown_hooks), strict=True):
        if "set_sigterm_handler" not in inspect.unwrap(function).__code__.co_names:
            raise ray_moved(f"{caller} no longer installs its SIGTERM handler through {TARGET}", where=TARGET)
    return f"{TARGET} found (called by {', '.join(CALLERS)})"
