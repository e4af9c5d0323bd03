"""Every use of Data-Juicer's and Ray's private internals (and loguru's, jsonargparse's, ddsketch's and
importlib's), grouped by area, each checked by ``dj-elastic doctor``."""

__all__ = [
    "ddsketch_store",
    "dj_config_internals",
    "dj_ops_internals",
    "importlib_deferred",
    "loguru_internals",
    "ray_internals",
    "targets",
]
