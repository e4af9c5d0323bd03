"""``clean.json``: the shard outputs of a finished job were (or are being) removed, its export kept
(``shards.clean``).  Written before the first file is removed, so a clean killed half-way leaves a job
every reader already treats as cleaned: ``verify`` checks the export against the recorded hashes instead
of the outputs, and whatever would need the outputs again (``retry``, a merge elsewhere, ``merge --follow``)
refuses with :func:`cleaned_error`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import Record


@dataclass(frozen=True)
class CleanRecord(Record):
    KIND: ClassVar[str] = "clean"
    job_id: str
    output_path: str  # the export merge.json names, verified before anything was removed
    layout: str  # its layout: "file" or "parts"
    merge_sha256: str  # merge.json's sha256 then: of the merged file, or of the parts index
    started_at: float
    complete: bool = False  # every reclaimable file removed (False: a clean was stopped; run it again)
    files: int = 0  # removed, once complete
    bytes_freed: int = 0  # the sizes of the removed files that had no other name


def read_cleaned(layout: JobLayout) -> CleanRecord | None:
    """The job's clean record; None when its shard outputs were never cleaned (JobDirError when corrupt)."""
    return CleanRecord.read(layout.clean_record)


def cleaned_error(layout: JobLayout, record: CleanRecord, needs: str) -> JobDirError:
    """The refusal of a step that needs the shard outputs ``record`` says were removed."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.started_at))
    return JobDirError(
        f"the shard outputs of this job were cleaned ({when}); {needs} needs them",
        where=str(layout.root),
        hint=f"the job's export is {record.output_path} (`dj-elastic verify` checks it); to run shards again, "
        "run the recipe with a new job_dir",
    )
