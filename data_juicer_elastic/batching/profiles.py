"""Shared batch profiles: what one process learned, so the next shard on any node starts at a safe size.

One file per (stage identity x accelerator model x cost model x ceiling), ``<job_dir>/batch-profiles/<key>.json``;
advice, never authority (docs/adaptive-batching.md).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final

from loguru import logger

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout, ensure_dir
from data_juicer_elastic.jobdir.records import Record
from data_juicer_elastic.sharedfs import fsio

MAX_AGE_SECS: Final = 24 * 3600.0
_warned: set[str] = set()


@dataclass(frozen=True)
class BatchProfile(Record):
    KIND: ClassVar[str] = "batch-profile"
    stage_key: str
    accelerator: str
    cost_model: str
    max_rows: int
    safe: float | None  # largest micro-batch cost that succeeded
    failing: float | None  # smallest micro-batch cost that ran out of memory (while in force)
    successes: int
    ooms: int
    updated_at: float  # wall clock of the writer (age check only)
    writer: str  # host:pid, informational


def profile_key(stage_key: str, accelerator: str, cost_model: str, max_rows: int) -> str:
    text = "\x1f".join((stage_key, accelerator, cost_model, str(max_rows)))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def read_profile(
    layout: JobLayout, stage_key: str, accelerator: str, cost_model: str, max_rows: int
) -> BatchProfile | None:
    """The usable profile, or None (missing, corrupt, stale or for another configuration)."""
    path = layout.batch_profile(profile_key(stage_key, accelerator, cost_model, max_rows))
    try:
        data = fsio.read_record(path)
    except OSError as exc:
        _warn_once(path, f"cannot read batch profile {path}: {exc}; starting from the configured batch_size")
        return None
    if data is None:
        return None
    try:
        profile = BatchProfile.parse(data, path)
    except JobDirError as exc:
        _warn_once(path, f"ignoring batch profile: {exc}")
        return None
    now = time.time()
    problem = None
    wanted = (stage_key, accelerator, cost_model, max_rows)
    if (profile.stage_key, profile.accelerator, profile.cost_model, profile.max_rows) != wanted:
        problem = "it belongs to another stage or configuration"
    elif abs(now - profile.updated_at) > MAX_AGE_SECS:
        problem = f"it is stale (written {now - profile.updated_at:.0f}s ago)"
    elif not _valid_bounds(profile):
        problem = f"its bounds are not usable (safe={profile.safe}, failing={profile.failing})"
    if problem:
        _warn_once(path, f"ignoring batch profile {path}: {problem}")
        return None
    return profile


def write_profile(layout: JobLayout, profile: BatchProfile) -> Path:
    path = layout.batch_profile(
        profile_key(profile.stage_key, profile.accelerator, profile.cost_model, profile.max_rows)
    )
    ensure_dir(layout, path.parent)
    fsio.atomic_write(path, profile.encode(), durable=False)  # advice: losing it on a crash costs one re-learn
    return path


def _valid_bounds(profile: BatchProfile) -> bool:
    safe, failing = profile.safe, profile.failing
    if any(v is not None and not (0 < v < math.inf) for v in (safe, failing)) or profile.max_rows < 1:
        return False
    if safe is None and failing is None:
        return False
    return safe is None or failing is None or safe < failing


def _warn_once(path: Path, message: str) -> None:
    key = str(path)
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)
