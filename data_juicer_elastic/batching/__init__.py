"""Adaptive micro-batching with lossless OOM recovery for batched Data-Juicer Mappers (docs/adaptive-batching.md).

``oom`` (:func:`classify_oom`: which exceptions a smaller micro-batch can fix), ``policy`` (:class:`BatchPolicy`,
the pure size controller), ``engine`` (:class:`MicroBatcher`, the lossless loop), ``batches`` (column batches),
``mixin`` (:class:`AdaptiveBatchingMixin` for your own Mappers), ``optin`` (recipe ``adaptive_batching: true``),
``runtime`` (per-process state, attempt context, telemetry), ``profiles`` (shared through the job directory),
``demo`` (``elastic_oom_demo_mapper``, CPU-safe).  Importing this package imports neither Ray, torch nor Data-Juicer.
"""

from __future__ import annotations

from data_juicer_elastic.batching.engine import MicroBatcher
from data_juicer_elastic.batching.mixin import AdaptiveBatchingMixin
from data_juicer_elastic.batching.oom import classify_oom
from data_juicer_elastic.batching.policy import BatchPolicy

__all__ = ["AdaptiveBatchingMixin", "BatchPolicy", "MicroBatcher", "classify_oom"]
