"""Give Data-Juicer's Ray loader the shard as this package read it, for the length of one shard run.

What.  While :func:`shard_source` is active, ``RayDataset.read`` (py-data-juicer 1.6.1,
the one call its Ray load strategy makes for a local JSONL path) returns, for the
attempt's shard path, a materialized Ray dataset built by ``shard_reader`` with the
job's row schema and the row-number column, instead of Ray's JSON reader.  Everything
after the read (the media-path pass, the operators, the materialize) is Data-Juicer's own.

Why.  (1) Lossless, shard-independent types: see ``shard_reader`` and ``row_types``.
(2) One read per shard: ``RayExecutor.run`` touches a lazy dataset three times before
processing it (``columns()`` in ``RayDataset.__init__`` runs ``read -> limit(1)``,
``count()`` reads everything, then processing reads it again), and the first of those
force-cancels the still-streaming read task, which kills its Ray worker (raylet: "The
worker exits because the task ReadJSONStream has received a force ray.cancel request");
the next task then waits seconds for a fresh worker to import Data-Juicer.  A
materialized dataset answers ``columns()``, ``schema()`` and ``count()`` from block
metadata.  The cost: a shard's input blocks stay in the object store while it runs,
which is why shards should stay a small fraction of the node's object store.

Scope: only while a shard runs in this worker process (reference-counted, so shard runs
in several threads share one patch and the last one out restores the original), and
only for the paths registered; any other path read meanwhile is refused loudly.
Data-Juicer's files are not modified.  If py-data-juicer moves ``RayDataset.read`` the
shard fails with an IntegrationError naming it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

from data_juicer_elastic.errors import IntegrationError

TARGET: Final = "data_juicer.core.data.ray_dataset.RayDataset.read"
_LOCK = threading.Lock()
_sources: dict[str, Callable[[], Any]] = {}  # shard path -> builds its dataset; guarded by _LOCK
_original: Any = None  # RayDataset.__dict__["read"] as found by the first shard run


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
def shard_source(path: str | os.PathLike, build: Callable[[], Any]) -> Iterator[None]:
    """While active, ``RayDataset.read(<format>, path)`` returns ``build()`` (a materialized Ray Dataset)."""
    global _original
    key = os.path.abspath(path)
    cls = _ray_dataset_class()
    with _LOCK:
        if not _sources:
            static = inspect.getattr_static(cls, "read", None)
            if not isinstance(static, classmethod):
                raise IntegrationError(
                    f"{TARGET} is missing or no longer a classmethod",
                    where="py-data-juicer",
                    hint="install py-data-juicer>=1.6.1,<1.7",
                )
            _original = static
            cls.read = classmethod(_from_sources(static.__func__))
        if key in _sources:
            raise IntegrationError(f"shard {key} is already being read by another run in this process")
        _sources[key] = build
    try:
        yield
    finally:
        with _LOCK:
            del _sources[key]
            if not _sources:
                cls.read = _original
                _original = None


def _from_sources(read: Any) -> Any:
    @functools.wraps(read)
    def read_shard(klass: Any, data_format: Any, paths: Any, **kwargs: Any) -> Any:
        key = os.path.abspath(paths) if isinstance(paths, str | os.PathLike) else None
        with _LOCK:
            build = _sources.get(key) if key is not None else None
        if build is None:
            raise IntegrationError(
                f"Data-Juicer asked to read {paths!r} ({data_format}) while a shard runs; only the shard is read",
                where=TARGET,
                hint="the shard recipe must not name other datasets",
            )
        return build()

    return read_shard
