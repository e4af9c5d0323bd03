"""Read a shard once: materialize what Data-Juicer's Ray loader reads, for the length of one shard run.

Why.  ``RayExecutor.run`` (py-data-juicer 1.6.1) touches the freshly read,
lazy Ray dataset three times before processing it:

* ``RayDataset.__init__`` -> ``set_dataset_to_absolute_path`` -> ``columns()``:
  the schema is unknown for a JSON read, so Ray executes ``read -> limit(1)``
  (later ``columns()`` / ``schema()`` calls hit Ray's per-plan schema cache);
* ``input_rows = dataset.data.count()``: a second full read;
* ``dataset.process(...)`` then ``materialize()``: the third read, with the ops.

The first one is the expensive one: once the limit is met, Ray shuts its
executor down with ``force=True``, which force-cancels the read task still
streaming the rest of the file, and a force-cancelled task takes its worker
process with it (raylet: "The worker exits because the task ReadJSONStream
has received a force ray.cancel request").  The next Ray Data task then waits
for a fresh worker to start and import Data-Juicer (~2-3 s on 2 CPUs); that
was the "shards alternate ~2 s / ~5 s" seen in benchmarks/bench_sharded.py.

What.  While :func:`read_once` is active, ``RayDataset.read`` returns the
dataset it read already materialized: one full read that is consumed to the
end (nothing cancelled, no worker killed), after which ``columns()``,
``schema()`` and ``count()`` are answered from block metadata, and processing
reads the blocks from the object store.  Rows, row order (blocks keep their
order; the runner sets ``preserve_order``) and Data-Juicer's own processing
are unchanged; the cost is that a shard's input blocks stay in the object
store until the shard's run ends, which is why shards should stay a small
fraction of the node's object store (Ray spills to disk otherwise).

Scope: only while a shard runs in this worker process (reference-counted, so
shard runs in several threads share one patch and the last one out restores
the original); Data-Juicer's files are not modified.  If py-data-juicer moves
``RayDataset.read`` the shard fails with an IntegrationError naming it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Iterator
from typing import Any, Final

from data_juicer_elastic.errors import IntegrationError

TARGET: Final = "data_juicer.core.data.ray_dataset.RayDataset.read"
_LOCK = threading.Lock()
_active = 0  # shard runs inside read_once(), guarded by _LOCK
_original: Any = None  # RayDataset.__dict__["read"] as found by the first of them


def _ray_dataset_class() -> Any:
    try:
        from data_juicer.core.data.ray_dataset import RayDataset
    except ImportError as exc:
        raise IntegrationError(
            f"cannot import {TARGET.rsplit('.', 1)[0]}: {exc}",
            where="py-data-juicer",
            hint="install py-data-juicer>=1.6.1,<1.7",
        ) from exc
    return RayDataset


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """Materialize every dataset ``RayDataset.read`` returns while the block runs."""
    global _active, _original
    cls = _ray_dataset_class()
    with _LOCK:
        if _active == 0:
            static = inspect.getattr_static(cls, "read", None)
            if not isinstance(static, classmethod):
                raise IntegrationError(
                    f"{TARGET} is missing or no longer a classmethod",
                    where="py-data-juicer",
                    hint="install py-data-juicer>=1.6.1,<1.7",
                )
            _original = static
            cls.read = classmethod(_materialized(static.__func__))
        _active += 1
    try:
        yield
    finally:
        with _LOCK:
            _active -= 1
            if _active == 0:
                cls.read = _original
                _original = None


def _materialized(read: Any) -> Any:
    @functools.wraps(read)
    def read_materialized(klass: Any, *args: Any, **kwargs: Any) -> Any:
        dataset = read(klass, *args, **kwargs)
        materialize = getattr(dataset, "materialize", None)
        if not callable(materialize):
            raise IntegrationError(
                f"{TARGET} returned {type(dataset).__name__}, not a Ray Dataset",
                where="py-data-juicer",
                hint="install py-data-juicer>=1.6.1,<1.7",
            )
        return materialize()

    return read_materialized
