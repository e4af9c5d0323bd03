"""Operator code a retry accepted: ``code-changes/<seq>.json``, one record per accepted change.

A job runs one version of its operator code (the fingerprint prepare records in the plan and the
manifest; docs/failure-semantics.md, "One version of the operator code per job").  ``dj-elastic retry
--accept-code-change`` lets the shards it requeues run fixed code: it records the new fingerprint
here, and from then on workers check their code against the latest record instead of the
manifest's.  Only the requeued shards can run under it, because retry accepts a change only when
every other shard is done (a done marker is terminal), so the records also say which shards' results
come from which code.  Records are published with ``link()`` (first wins) and never rewritten; a
damaged one is an error naming it, never a silent fall-back to older code.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import confine
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import ChecksummedRecord
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

_NAME: Final = re.compile(r"^(\d{6})\.json$")


@dataclass(frozen=True)
class CodeChange(ChecksummedRecord):
    KIND: ClassVar[str] = "code-change"
    seq: int  # 1, 2, ...: the latest is the job's code
    code: dict[str, Any]  # the fingerprint workers now check against (execution.code_fingerprint)
    shards: list[str]  # the shards requeued to run under it
    changes: list[str] = field(default_factory=list)  # what differed from the code before, as retry showed it
    accepted_at: float = 0.0
    by: str = ""  # node and pid of the retry
    checksum: str | None = None


def change_path(layout: JobLayout, seq: int) -> Path:
    return layout.code_changes_dir / f"{seq:06d}.json"


def latest_change(layout: JobLayout) -> CodeChange | None:
    """The latest accepted change, or None; JobDirError naming a damaged record."""
    seqs = [int(m.group(1)) for m in map(_NAME.match, fsio.list_names(layout.code_changes_dir)) if m]
    seq, data = max(seqs, default=0), None
    if seq:
        data = fsio.read_record(change_path(layout, seq))
        if data is None:  # listed, then gone: records are never removed, so the directory was edited
            path = change_path(layout, seq)
            raise JobDirError("code-change record vanished while read", where=str(path), hint="prepare a new job_dir")
    # A listing may lag on NFS; a name opened is current: the records after the listed ones are probed.
    while (newer := fsio.read_record(change_path(layout, seq + 1))) is not None:
        seq, data = seq + 1, newer
    if data is None:
        return None
    path = change_path(layout, seq)
    try:
        return CodeChange.parse_checked(data, path)
    except JobDirError as exc:
        raise JobDirError(
            exc.message,
            where=str(path),
            hint="the operator code this job runs is unknown: prepare a new job_dir (or restore the record)",
        ) from None


def job_code(layout: JobLayout, prepared: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fingerprint a worker must match: the latest accepted change's, else the one prepare recorded."""
    change = latest_change(layout)
    return prepared if change is None else change.code


def record_change(layout: JobLayout, code: dict[str, Any], shards: list[str], changes: list[str]) -> CodeChange:
    """Publish the next change record (before any shard is requeued under it)."""
    latest = latest_change(layout)
    seq = 1 if latest is None else latest.seq + 1
    me = WorkerIdentity.current()
    record = CodeChange(seq, dict(code), list(shards), list(changes), time.time(), f"{me.node_id} pid {me.pid}")
    confine.ensure_dir(layout, layout.code_changes_dir)
    path = change_path(layout, seq)
    if not fsio.publish_bytes(path, record.encode()):
        raise JobDirError(
            "another retry recorded a code change at the same time",
            where=str(path),
            hint="run the retry again: it checks the job as it is now",
        )
    return record
