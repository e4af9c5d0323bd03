"""Give Data-Juicer's Ray loader the shard as this package read it, for the length of one shard run.

While :func:`shard_source` is active, ``RayDataset.read`` answers the attempt's shard path with a
materialized Ray dataset built by ``shard_reader`` (why materialized: docs/architecture.md,
"execution").  The swap (``compat.dj_ops_internals``) is reference-counted across threads and serves
only registered paths: any other path read meanwhile is refused.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from data_juicer_elastic.compat import dj_ops_internals
from data_juicer_elastic.compat.dj_ops_internals import RAY_DATASET_READ as TARGET
from data_juicer_elastic.errors import IntegrationError

_LOCK = threading.Lock()
_sources: dict[str, Callable[[], Any]] = {}  # shard path -> builds its dataset; guarded by _LOCK
_original: Any = None  # RayDataset.read as found by the first shard run


@contextlib.contextmanager
def shard_source(path: str | os.PathLike, build: Callable[[], Any]) -> Iterator[None]:
    """While active, ``RayDataset.read(<format>, path)`` returns ``build()`` (a materialized Ray Dataset)."""
    global _original
    key = os.path.abspath(path)
    dj_ops_internals.ray_dataset_class()  # fails loudly before anything is registered
    with _LOCK:
        if not _sources:
            _original = dj_ops_internals.replace_read(_read_shard)
        if key in _sources:
            raise IntegrationError(f"shard {key} is already being read by another run in this process")
        _sources[key] = build
    try:
        yield
    finally:
        with _LOCK:
            del _sources[key]
            if not _sources:
                dj_ops_internals.restore_read(_original)
                _original = None


def shard_key(attempt_dir: str | os.PathLike) -> Path:
    """The ``dataset_path`` Data-Juicer is given for a shard: only a key for :func:`shard_source`, an
    empty file (Data-Juicer's config treats a path that does not exist as a remote dataset)."""
    key = Path(attempt_dir) / "input.jsonl"
    if not key.exists():
        key.touch()
    return key


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
