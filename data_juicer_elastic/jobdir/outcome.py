"""Whether a job is finished, from its job directory: every shard done, and which failed for good."""

from __future__ import annotations

from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import Manifest
from data_juicer_elastic.jobdir.shard_state import Markers, ShardState, TerminalInfo, decide_state, read_markers


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
        shard = entry.shard_id
        markers = Markers(shard, known_done=True) if shard in known_done else read_markers(layout, shard)
        if decide_state(markers) is ShardState.DONE:
            continue
        complete = False
        if markers.terminal_info is not None:
            terminal.append(markers.terminal_info)
    return complete, terminal
