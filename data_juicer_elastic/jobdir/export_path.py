"""Where a merge may write: the export path, checked before anything is written (the refused cases:
docs/output-layouts.md; the export path is never written through a link: docs/job-dir-security.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from data_juicer_elastic.errors import ConfigError, Places, preview

# The names a parts export holds (shards.parts writes them; Data-Juicer's loaders take only the
# parts as data: docs/output-layouts.md).  The index is written last: its presence means complete.
PARTS_INDEX: Final = "_index.dj-elastic"
PART_STATS_SUFFIX: Final = ".stats"
_PARTS_ENTRY: Final = re.compile(r"^part-\d{5}-of-\d{5}(\.jsonl|\.stats|\.errors)$")


def part_name(shard_id: str) -> str:
    """``part-00003-of-00016.jsonl``: a shard's part (name order is input order)."""
    return shard_id + ".jsonl"


def part_stats_name(shard_id: str) -> str:
    """``part-00003-of-00016.stats``: the part's per-row stats (JSONL, a suffix no loader takes as data)."""
    return shard_id + PART_STATS_SUFFIX


def part_errors_name(shard_id: str) -> str:
    """``part-00003-of-00016.errors``: the rows operators failed on in that shard (quarantine; JSONL)."""
    return shard_id + ".errors"


def is_parts_entry(name: str) -> bool:
    """Whether a parts export may hold a file of this name (a part, its stats, the index)."""
    return name == PARTS_INDEX or bool(_PARTS_ENTRY.match(name))


def export_target(path: str | os.PathLike) -> Path:
    """``path`` made absolute (``~`` expanded) without resolving its last component."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def inside(directory: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether ``path`` (its parent's real path, its own name) lies in or at ``directory``."""
    root = os.path.realpath(os.path.abspath(os.path.expanduser(os.fspath(directory))))
    at = export_target(path)
    target = os.path.join(os.path.realpath(at.parent), at.name)  # a link *at* the path is not followed
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def merge_places(job_dir: str | os.PathLike, export_path: str | os.PathLike, *args: object, **kwargs: object) -> Places:
    """Where a merge reads and writes, for a storage error's hint (``errors.storage_error``): the
    job directory, then the export location (the folder of the merged output and its siblings).
    Takes a merge's own arguments, so it can be given to ``errors.storage_errors`` as is."""
    return (("job directory", job_dir), ("export location", export_target(export_path).parent))


def check_export_path(
    job_dir: str | os.PathLike, path: str | os.PathLike, key: str = "export_path", layout: str = "file"
) -> Path:
    """The export path to write (see :func:`export_target`); ConfigError naming ``key`` when it
    lies inside the job directory, or is a directory (``layout`` file), or is not a place a
    parts export may be published (``layout`` parts: :func:`check_parts_target`)."""
    target = export_target(path)
    if inside(job_dir, target):
        raise ConfigError(
            f"{target} is inside the job directory {job_dir}: the merge would overwrite the job's own files",
            where=key,
            hint="choose a path outside the job directory",
        )
    if layout == "parts":
        check_parts_target(job_dir, target, key)
        return target
    if target.is_dir() and not target.is_symlink():
        raise ConfigError(
            f"{target} is a directory; the merged output is one JSONL file",
            where=key,
            hint="name the file to write, e.g. <that directory>/merged.jsonl, or set elastic.export_layout: parts",
        )
    return target


def check_parts_target(job_dir: str | os.PathLike, target: Path, key: str) -> None:
    """ConfigError unless ``target`` is absent, an empty directory, or a directory holding only
    what a parts export holds (an earlier export: whether it is this job's is decided when it is
    published); never a link, a file, or a directory that holds the job directory."""
    if inside(target, job_dir):
        raise ConfigError(
            f"the job directory {job_dir} is inside the export directory {target}: Data-Juicer's loaders would "
            "read the job's files as data",
            where=key,
            hint="choose an export directory outside the job directory, and not above it",
        )
    if os.path.islink(target):
        raise ConfigError(
            f"a symlink is at the export path (to {os.readlink(target)}); a parts export is never written through it",
            where=key,
            hint="remove the link, or name a directory that is not a link",
        )
    if not os.path.lexists(target):
        return
    if not target.is_dir():
        raise ConfigError(
            f"{target} is a file; export_layout parts publishes a directory of part files there",
            where=key,
            hint="name a new or empty directory (e.g. <that path>-parts), or set elastic.export_layout: file",
        )
    foreign = sorted(name for name in os.listdir(target) if not is_parts_entry(name))
    if foreign:
        raise ConfigError(
            f"{target} holds files a parts export never writes ({preview(foreign)}); it is published only into an "
            "empty directory or over an earlier parts export, and never removes files it did not write",
            where=key,
            hint="name a new or empty directory",
        )


def check_recipe_paths(job_dir: str | os.PathLike, paths: Mapping[str, str | None], layout: str = "file") -> None:
    """Refuse Data-Juicer output paths of a recipe (export_path, work_dir, ...) inside the job
    directory (or, for a parts export, inside the export directory), before Data-Juicer's set-up
    creates any of them there."""
    export = paths.get("export_path")
    parts = export if layout == "parts" and export and "://" not in str(export) else None
    for key, value in paths.items():
        if not value or "://" in str(value):  # unset, or a remote (s3://...) path: not on this filesystem
            continue
        if key == "export_path":
            check_export_path(job_dir, value, key, layout)
        elif inside(job_dir, value):
            raise ConfigError(
                f"{export_target(value)} is inside the job directory {job_dir}: Data-Juicer would write its "
                "logs and records there",
                where=key,
                hint="choose a directory outside the job directory",
            )
        elif parts is not None and inside(parts, value):
            raise ConfigError(
                f"{export_target(value)} is inside the export directory {export_target(parts)}: Data-Juicer "
                "would write its logs and records among the parts",
                where=key,
                hint="choose a directory outside the export directory",
            )
