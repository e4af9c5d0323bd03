"""Adaptive micro-batching with lossless OOM recovery for batched Data-Juicer Mappers (docs/adaptive-batching.md).
Importing this package imports neither Ray, torch nor Data-Juicer.
"""

from __future__ import annotations

import importlib

# The names this package offers, each loaded from its module on first use (PEP 562): importing one
# of the package's modules runs none of the others.  A Ray worker that unpickles a quarantine class
# imports ``quarantine.collector`` first, which imports ``batching.engine``; an ``__init__`` that
# imported ``mixin`` (which uses the collector) would meet the collector half-initialised.
_NAMES = {
    "AdaptiveBatchingMixin": "mixin",
    "BatchPolicy": "policy",
    "MicroBatcher": "engine",
    "classify_oom": "policy",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
