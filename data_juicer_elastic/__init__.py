"""data-juicer-elastic: elastic sharded execution for Data-Juicer.

Importing this package is cheap: it imports neither Ray, torch nor
Data-Juicer's core.  Public names are loaded on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "ElasticShardedExecutor", "ElasticSettings"]


def __getattr__(name: str):
    if name == "ElasticShardedExecutor":
        from data_juicer_elastic.executor import ElasticShardedExecutor

        return ElasticShardedExecutor
    if name == "ElasticSettings":
        from data_juicer_elastic.settings import ElasticSettings

        return ElasticSettings
    raise AttributeError(name)
