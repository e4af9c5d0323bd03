"""Whether a job is finished, from its job directory: every shard done, and which failed for good."""

from __future__ import annotations

from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import Manifest, TerminalInfo


def job_outcome(
    layout: JobLayout, manifest: Manifest, known_done: set[str] | frozenset[str] = frozenset()
) -> tuple[bool, list[TerminalInfo]]:
    """(every shard done, [(shard id, last error) for terminal failures]) from the job dir.

    ``known_done``: shards the caller knows are done (a marker it parsed, or a name in a
    ``done/`` listing: markers are never removed), not opened again, so W workers leaving
    a finished job do not each open all S markers.  A listed marker that is corrupt is
    then reported by merge, which validates every marker and names the shard.
    """
    complete = True
    terminal: list[TerminalInfo] = []
    for entry in manifest.shards:
        if entry.shard_id in known_done:
            continue
        result, done_error = attempts.read_done(layout, entry.shard_id)
        if result is not None:
            continue
        complete = False
        if done_error is not None:
            terminal.append(TerminalInfo(entry.shard_id, f"corrupt done marker: {done_error}"))
            continue
        failed, failed_error = attempts.read_terminal(layout, entry.shard_id)
        if failed is not None:
            terminal.append(TerminalInfo(entry.shard_id, failed.last_error))
        elif failed_error is not None:
            terminal.append(TerminalInfo(entry.shard_id, f"corrupt failed marker: {failed_error}"))
    return complete, terminal
