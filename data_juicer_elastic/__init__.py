"""data-juicer-elastic: elastic sharded execution for Data-Juicer.

Importing this package is cheap: it imports neither Ray, torch nor
Data-Juicer's core.  Public names are loaded on first use.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# The Data-Juicer releases this plugin is built against (setup.cfg pins the same range; a test
# checks they agree).  Every hint that tells a user which Data-Juicer to install quotes this.
DATA_JUICER_REQUIREMENT = "py-data-juicer>=1.6.1,<1.7"

__all__ = ["__version__", "DATA_JUICER_REQUIREMENT", "ElasticShardedExecutor", "ElasticSettings"]
_LAZY = {"ElasticShardedExecutor": "executor", "ElasticSettings": "settings"}  # name -> its module


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
