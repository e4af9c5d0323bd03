"""The export files this job itself wrote, as ``merge.json`` proves them: a file at a path the record
names whose sha256 is the one recorded.  A merge may replace such a file without ``overwrite`` (after
``dj-elastic retry`` the job's result changed and its export follows); anything else at the export
path (edited since, written by another job or by hand) still needs ``overwrite``.
"""

from __future__ import annotations

import os
from pathlib import Path

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.result_records import MergeRecord
from data_juicer_elastic.sharedfs import fsio


def recorded_files(layout: JobLayout) -> dict[Path, str]:
    """{path: sha256} of the export files the last merge wrote (a one-file export: the output, its
    row stats, its quarantine file); empty without a readable record or for a parts export."""
    try:
        record = MergeRecord.read(layout.merge_record)
    except JobDirError:  # a damaged record proves nothing
        return {}
    if record is None or record.layout != "file":
        return {}
    pairs = [
        (record.output_path, record.sha256),
        (record.row_stats_path, record.row_stats_sha256),
        (record.errors_path, record.errors_sha256),
    ]
    return {Path(path): sha for path, sha in pairs if path and sha}


def written_by_job(layout: JobLayout, path: Path, recorded: dict[Path, str] | None = None) -> bool:
    """Whether the regular file at ``path`` is byte for byte the one this job's last merge wrote there
    (one read of it)."""
    sha = (recorded_files(layout) if recorded is None else recorded).get(Path(path))
    if sha is None or os.path.islink(path) or not os.path.isfile(path):
        return False
    try:
        return fsio.file_sha256(Path(path))[1] == sha
    except OSError:
        return False


def export_changed(layout: JobLayout) -> Path | None:
    """The first export file the last merge wrote that is no longer what it wrote (None: each is
    as written, or gone), so the next merge could not replace it without ``overwrite``."""
    recorded = recorded_files(layout)
    for path in recorded:
        if (os.path.lexists(path)) and not written_by_job(layout, path, recorded):
            return path
    return None
