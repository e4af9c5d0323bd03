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
Data-Juicer's files are not modified.  The swap itself is ``compat.dj_ray_dataset``: if
py-data-juicer moves ``RayDataset.read`` the shard fails with an IntegrationError naming it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from data_juicer_elastic.compat import dj_ray_dataset
from data_juicer_elastic.compat.dj_ray_dataset import TARGET
from data_juicer_elastic.errors import IntegrationError

_LOCK = threading.Lock()
_sources: dict[str, Callable[[], Any]] = {}  # shard path -> builds its dataset; guarded by _LOCK
_original: Any = None  # RayDataset.read as found by the first shard run


@contextlib.contextmanager
def shard_source(path: str | os.PathLike, build: Callable[[], Any]) -> Iterator[None]:
    """While active, ``RayDataset.read(<format>, path)`` returns ``build()`` (a materialized Ray Dataset)."""
    global _original
    key = os.path.abspath(path)
    dj_ray_dataset.ray_dataset_class()  # fails loudly before anything is registered
    with _LOCK:
        if not _sources:
            _original = dj_ray_dataset.replace_read(_read_shard)
        if key in _sources:
            raise IntegrationError(f"shard {key} is already being read by another run in this process")
        _sources[key] = build
    try:
        yield
    finally:
        with _LOCK:
            del _sources[key]
            if not _sources:
                dj_ray_dataset.restore_read(_original)
                _original = None


def shard_key(attempt_dir: str | os.PathLike) -> Path:
    """The ``dataset_path`` Data-Juicer is given for a shard: only a key (:func:`shard_source`
    answers Data-Juicer's read of it with the shard as this package read it), inside the
    attempt.  An empty file is placed there: Data-Juicer's config treats a path that does not
    exist as a remote dataset."""
    key = Path(attempt_dir) / "input.jsonl"
    if not key.exists():
        key.touch()
    return key


def materialized(tables: list[Any]) -> Any:
    """A shard's Arrow tables as the materialized Ray dataset :func:`shard_source` hands over."""
    import ray

    return ray.data.from_arrow(tables)


def _read_shard(klass: Any, data_format: Any, paths: Any, **kwargs: Any) -> Any:
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
