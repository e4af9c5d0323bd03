"""Keep every write inside the job directory (a symlink planted in it is refused before anything is
written below it), and refuse directories that are not ours (docs/job-dir-security.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from data_juicer_elastic.errors import JobDirError, UnsafePathError, preview
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.sharedfs import fsio

# Every name the plugin itself puts at the top of a job directory (docs/architecture.md).
OUR_NAMES: Final = frozenset(
    "manifest.json manifest-rows.json plan.json scans recipe.json merge.json clean.json shards claims heartbeats "
    "releases failures attempts done failed history cache coordination logs batch-profiles stats summary "
    "code-changes".split()
)
# Hidden names are ours too: staging directories, temp files beside records, NFS
# ``.nfsXXXX`` leftovers.  Lost+found appears at the top of a fresh filesystem.
_IGNORED_PREFIXES: Final = (".",)
_IGNORED_NAMES: Final = frozenset({"lost+found"})


def check_inside(layout: JobLayout, path: str | Path) -> Path:
    """``path`` if it (lexically and after resolving links) lies in the job directory, else
    UnsafePathError naming the link that leads out.  Names that do not exist yet resolve
    lexically; links are resolved only when there are some."""
    path = Path(path)
    root = layout.root
    text, prefix = str(path), str(root).rstrip(os.sep) + os.sep
    if text != str(root) and not text.startswith(prefix):
        raise UnsafePathError(f"{path} is not inside the job directory", where=str(root))
    current = prefix[:-1]
    for part in text[len(prefix) :].split(os.sep) if text != str(root) else ():
        if part in ("..", "."):
            raise UnsafePathError(f"{path} is not inside the job directory", where=str(root))
        current = os.path.join(current, part)
        if os.path.islink(current):
            _check_link(root, path, Path(current))
    return path


def _check_link(root: Path, path: Path, link: Path) -> None:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise UnsafePathError(
            f"{path} leads outside the job directory (it resolves to {real}): a symlink was planted in it",
            where=str(link),
            hint="remove the link (dj-elastic never writes through links out of a job directory) or use a new job_dir",
        )


def ensure_dir(layout: JobLayout, directory: str | Path) -> Path:
    """``makedirs`` of a job-directory path, refused before anything is created outside."""
    directory = check_inside(layout, directory)
    fsio.makedirs(directory)
    return directory


def check_layout(layout: JobLayout) -> None:
    """Refuse a job directory whose top-level entries are links leading outside it (cheap:
    one ``lstat`` per name; per-shard directories are checked when written)."""
    for name in sorted(OUR_NAMES):
        path = layout.root / name
        if os.path.islink(path):
            check_inside(layout, path)


def check_ours(layout: JobLayout) -> None:
    """Refuse a job directory that holds anything but a dj-elastic job (or nothing), before the first
    write into one without a manifest: a ``job_dir`` pointed at a home directory must not litter it."""
    foreign = [
        name
        for name in fsio.list_names(layout.root)
        if name not in OUR_NAMES and name not in _IGNORED_NAMES and not name.startswith(_IGNORED_PREFIXES)
    ]
    if foreign:
        raise JobDirError(
            f"job_dir is not empty and is not a dj-elastic job directory (it holds {preview(foreign)})",
            where=str(layout.root),
            hint="point elastic.job_dir at a new or empty directory",
        )
    check_layout(layout)


def make_job_dir(layout: JobLayout) -> None:
    """Create the job directory if needed; JobDirError (not a traceback) when a file is in the way."""
    root = layout.root
    if os.path.lexists(root) and not os.path.isdir(root):
        raise not_a_directory(root)
    try:
        fsio.makedirs(root)
    except (FileExistsError, NotADirectoryError):
        raise not_a_directory(root) from None


def not_a_directory(root: Path) -> JobDirError:
    return JobDirError(
        "job_dir is not a directory (a file is at that path or above it)",
        where=str(root),
        hint="point job_dir at a new or empty directory, or at a prepared job directory",
    )


def open_job_dir(layout: JobLayout) -> None:
    """Create the job directory if needed and refuse it unless it is (or can become) ours:
    empty, or a dj-elastic job whose top-level directories do not lead elsewhere."""
    make_job_dir(layout)
    if fsio.exists(layout.manifest) or fsio.exists(layout.plan):
        check_layout(layout)  # the manifest itself is validated by whoever loads it
    else:
        check_ours(layout)
