"""Adaptive micro-batching with lossless OOM recovery for batched Data-Juicer Mappers.

* :mod:`.oom`      - :func:`classify_oom`: which exceptions a smaller micro-batch can fix
* :mod:`.policy`   - :class:`BatchPolicy`: the pure, clock-injected size controller
* :mod:`.engine`   - :class:`MicroBatcher`: slice, retry the same offset smaller, check, merge in order
* :mod:`.mixin`    - :class:`AdaptiveBatchingMixin` for your own Mappers
* :mod:`.optin`    - recipe ``adaptive_batching: true`` on any registered Mapper
* :mod:`.runtime`  - per-process state, attempt context and telemetry
* :mod:`.profiles` - batch profiles shared through the job directory
* :mod:`.demo`     - ``elastic_oom_demo_mapper``, a CPU-safe OOM-injecting operator

Importing this package imports neither Ray, torch nor Data-Juicer.
"""

from __future__ import annotations

from data_juicer_elastic.batching.engine import MicroBatcher
from data_juicer_elastic.batching.mixin import AdaptiveBatchingMixin
from data_juicer_elastic.batching.oom import classify_oom
from data_juicer_elastic.batching.policy import BatchPolicy

__all__ = ["AdaptiveBatchingMixin", "BatchPolicy", "MicroBatcher", "classify_oom"]
