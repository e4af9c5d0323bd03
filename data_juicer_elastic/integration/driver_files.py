"""What the driver of an elastic run writes outside the shards, and what a refused run leaves behind.
Which tool's config parse is running (the driver's, ``dj-analyze``'s): :func:`parsing`, set by
``dispatch.run_tool`` and ``dj-elastic run``, read by the setup patch.

* Data-Juicer's work dir: for the driver of an elastic run (``dj-process``, ``dj-elastic run``)
  without a ``work_dir`` of the recipe's own, ``<job_dir>/logs/<node>/data-juicer/<its job id>/``
  instead of a new folder beside the export (docs/architecture.md, "Job directory"), once the job
  directory is checked to be ours.  ``dj-analyze`` keeps Data-Juicer's default.
* A refused run (one error before any shard could run) leaves no job directory the next run would
  have to be told about: one this process found absent and created, with no manifest published
  and no other instance joined, is renamed aside (a partly removed one never looks like a job)
  and removed, and so is each folder above it this process found absent, while it is empty (the
  demo's ``outputs/demo/``).  A job directory or folder that existed before is never removed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.layout import (
    JobLayout,
    check_inside,
    check_layout,
    check_ours,
    not_a_directory,
    resolve_user_path,
)
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

DJ_WORK_DIR: Final = "data-juicer"  # under <job_dir>/logs/<node>/; Data-Juicer appends its job id
DRIVER: Final = "driver"  # of an elastic run: dj-process (dispatching), dj-elastic run
ANALYZER: Final = "analyzer"  # dj-analyze

_local = threading.local()
_lock = threading.Lock()
# job dir -> it and the folders above it that did not exist when this process first looked
_absent: dict[Path, list[Path]] = {}


@contextlib.contextmanager
def parsing(tool: str) -> Iterator[None]:
    """Data-Juicer's config parse inside this block is ``tool``'s (:data:`DRIVER` or :data:`ANALYZER`)."""
    before = parser_of()
    _local.tool = tool
    try:
        yield
    finally:
        _local.tool = before


def parser_of() -> str | None:
    """Whose config parse runs in this thread: :data:`DRIVER`, :data:`ANALYZER`, or None."""
    return getattr(_local, "tool", None)


def note_job_dir(job_dir: str | os.PathLike) -> None:
    """Remember whether the job directory exists now; the first look for a path counts."""
    path = resolve_user_path(job_dir)
    absent = list(itertools.takewhile(lambda p: not os.path.lexists(p), [path, *path.parents]))
    with _lock:
        _absent.setdefault(path, absent)


def place_work_dir(cfg: Any, job_dir: str) -> None:
    """For the driver, Data-Juicer's work dir under the job's node log folder (module docstring),
    unless the recipe names its own ``work_dir``.  JobDirError / UnsafePathError first for a job
    directory that is not ours."""
    if parser_of() != DRIVER or cfg.get("work_dir", None):
        return

    layout = JobLayout(resolve_user_path(job_dir))
    if os.path.isdir(layout.root):
        planned = os.path.exists(layout.plan) or os.path.exists(layout.manifest)
        (check_layout if planned else check_ours)(layout)
    elif os.path.lexists(layout.root):
        raise not_a_directory(layout.root)
    work_dir = layout.node_log_dir(WorkerIdentity.current().node_id) / DJ_WORK_DIR
    cfg.work_dir = str(check_inside(layout, work_dir))


def remove_refused_job_dirs() -> list[Path]:
    """After a refusal: remove each job directory this process created in which nothing ran and
    no other instance took part, and the empty folders above it this process created (module
    docstring); the job directories removed."""
    with _lock:
        candidates = [absent for absent in _absent.values() if absent]
    removed = []
    for job_dir, *above in candidates:
        if not _remove_if_unused(job_dir):
            continue
        removed.append(job_dir)
        for folder in above:
            try:
                os.rmdir(folder)  # only while empty: whatever another process put there stays
            except OSError:
                break
    return removed


def _remove_if_unused(root: Path) -> bool:
    layout = JobLayout(root)
    if not os.path.isdir(root) or os.path.islink(root) or os.path.exists(layout.manifest):
        return False
    if _participants(layout) > 1:
        return False  # another instance joined: it reads this run's outcome there
    aside = root.with_name(f".{root.name}.refused-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(root, aside)
    except OSError:
        return False
    shutil.rmtree(aside, ignore_errors=True)
    return True


def _participants(layout: Any) -> int:
    """Instances that joined any run of the job (their records under ``coordination/<run>/``)."""
    try:
        runs = os.listdir(layout.coordination_dir)
    except OSError:
        return 0
    count = 0
    for run in runs:
        with contextlib.suppress(OSError, JobDirError):  # not a run's folder
            count += sum(name.endswith(".json") for name in os.listdir(layout.participants_dir(run)))
    return count
