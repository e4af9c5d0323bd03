"""Re-checking a file an accepted attempt published (output, row stats, quarantine file): inside the
attempt's own directory, valid JSONL, and equal to its record; one reader, so the rules cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from data_juicer_elastic.errors import IntegrityError, JobDirError
from data_juicer_elastic.jobdir import confine
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import ShardEntry
from data_juicer_elastic.jobdir.result_records import ShardResult
from data_juicer_elastic.rows.jsonl import validate_jsonl_output
from data_juicer_elastic.sharedfs import fsio

FORGED_HINT = "the job directory was modified; prepare a new job_dir"


def locate_published_file(
    layout: JobLayout, entry: ShardEntry, result: ShardResult, *, what: str, relative: str, requeue: str
) -> Path:
    """The path of a file a done marker names, without reading it: inside the attempt's own
    directory, reached through no link out of the job directory, and present; IntegrityError
    naming the shard otherwise (publication of a parts export checks this much, and the size)."""
    where = f"shard {entry.shard_id}"
    try:
        path = layout.resolve_relative(relative)
        own = layout.attempt_dir(entry.shard_id, result.attempt_id)
    except JobDirError as exc:
        raise IntegrityError(f"bad {what} path {relative!r}: {exc.message}", where=where, hint=FORGED_HINT) from None
    if own not in path.parents:  # publish_done only accepts files there; anything else is forged
        raise IntegrityError(
            f"done marker names {what} {relative}, outside its attempt directory {layout.relative(own)}",
            where=where,
            hint=FORGED_HINT,
        )
    if not fsio.exists(path):
        raise IntegrityError(f"accepted {what} {path} is missing", where=where, hint=requeue)
    confine.check_inside(layout, path)  # a record may not lead the merge out through a planted link
    return path


def check_published_file(
    layout: JobLayout,
    entry: ShardEntry,
    result: ShardResult,
    *,
    what: str,
    relative: str,
    expected: tuple[int, int, str],
    requeue: str,
    sink: Callable[[bytes], None] | None = None,
) -> Path:
    """The file's path once its (rows, bytes, sha256) equal ``expected``; IntegrityError naming the
    shard.  ``what``: the kind of file, for messages; ``requeue``: the hint for a missing, corrupt or
    edited file; ``sink`` receives the file in blocks of whole, validated lines (merge copies)."""
    where = f"shard {entry.shard_id}"
    path = locate_published_file(layout, entry, result, what=what, relative=relative, requeue=requeue)
    try:
        found = validate_jsonl_output(path, str(path), sink)
    except ValueError as exc:
        raise IntegrityError(f"accepted {what} is corrupt: {exc}", where=where, hint=requeue) from None
    if tuple(found) != tuple(expected):
        rows, size, sha = expected
        raise IntegrityError(
            f"accepted {what} does not match its record: expected rows={rows} bytes={size} sha256={sha}, "
            f"found rows={found[0]} bytes={found[1]} sha256={found[2]}",
            where=where,
            hint=f"{path} was modified after publication; {requeue}",
        )
    return path
