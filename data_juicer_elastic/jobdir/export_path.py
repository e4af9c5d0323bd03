"""Where a merge may write: the export path, checked before anything is written.

The export path is the user's choice, but three choices would do harm:

* **inside the job directory.**  ``merge --output <job>/manifest.json --overwrite`` would
  replace the manifest, ``--output <job>/shards/<shard>.jsonl`` an input shard, and
  Data-Juicer's work dir (by default the export path's directory) would litter the job
  directory with logs before the plugin could refuse it.  Refused up front, naming the key.
* **a directory.**  The merged output is one JSONL file.
* **through a symlink.**  The *last* component of the export path is never followed: a
  link there (dangling or not) is a file that is there, replaced by the merged output only
  with overwrite, and never written through.  The merged output is published with
  ``link()``/``os.replace()`` and the overall-stats files beside it with ``os.replace()``:
  both act on the name, not on a link's target.  Directories above it may be links (a
  mount alias); the check against the job directory compares real paths.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from data_juicer_elastic.errors import ConfigError, Places


def export_target(path: str | os.PathLike) -> Path:
    """``path`` made absolute (``~`` expanded) without resolving its last component."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def _real(path: Path) -> str:
    # The parent's real path plus the name: a link *at* the path is not followed.
    return os.path.join(os.path.realpath(path.parent), path.name)


def inside(directory: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether ``path`` (its parent's real path, its own name) lies in or at ``directory``."""
    root = os.path.realpath(os.path.abspath(os.path.expanduser(os.fspath(directory))))
    target = _real(export_target(path))
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def merge_places(job_dir: str | os.PathLike, export_path: str | os.PathLike, *args: object, **kwargs: object) -> Places:
    """Where a merge reads and writes, for a storage error's hint (``errors.storage_error``): the
    job directory, then the export location (the folder of the merged output and its siblings).
    Takes a merge's own arguments, so it can be given to ``errors.storage_errors`` as is."""
    return (("job directory", job_dir), ("export location", export_target(export_path).parent))


def check_export_path(job_dir: str | os.PathLike, path: str | os.PathLike, key: str = "export_path") -> Path:
    """The export path to write (see :func:`export_target`); ConfigError naming ``key`` when it
    lies inside the job directory or is a directory."""
    target = export_target(path)
    if inside(job_dir, target):
        raise ConfigError(
            f"{target} is inside the job directory {job_dir}: the merge would overwrite the job's own files",
            where=key,
            hint="choose a path outside the job directory",
        )
    if target.is_dir() and not target.is_symlink():
        raise ConfigError(
            f"{target} is a directory; the merged output is one JSONL file",
            where=key,
            hint="name the file to write, e.g. <that directory>/merged.jsonl",
        )
    return target


def check_recipe_paths(job_dir: str | os.PathLike, paths: Mapping[str, str | None]) -> None:
    """Refuse Data-Juicer output paths of a recipe (export_path, work_dir, ...) inside the job
    directory, before Data-Juicer's set-up creates any of them there."""
    for key, value in paths.items():
        if not value or "://" in str(value):  # unset, or a remote (s3://...) path: not on this filesystem
            continue
        if key == "export_path":
            check_export_path(job_dir, value, key)
        elif inside(job_dir, value):
            raise ConfigError(
                f"{export_target(value)} is inside the job directory {job_dir}: Data-Juicer would write its "
                "logs and records there",
                where=key,
                hint="choose a directory outside the job directory",
            )
