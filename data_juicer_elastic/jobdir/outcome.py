"""Whether a job is finished, from its job directory: every shard done, and which failed for good.
:func:`leaving_outcome` answers from a fresh job summary (O(terminal failures) reads, not O(shards)).
"""

from __future__ import annotations

from collections.abc import Iterable

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.jobdir.job_summary import SummaryReader
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import Manifest
from data_juicer_elastic.jobdir.shard_state import (
    Markers,
    ShardState,
    TerminalInfo,
    decide_state,
    read_failed_marker,
    read_markers,
)


def job_outcome(
    layout: JobLayout, manifest: Manifest, known_done: set[str] | frozenset[str] = frozenset()
) -> tuple[bool, list[TerminalInfo]]:
    """(every shard done, [(shard id, last error) for terminal failures]) from the job dir.
    ``known_done``: shards the caller knows are done (a parsed marker, a ``done/`` listing), not
    opened again; a listed marker that is corrupt is reported by merge, which validates every one."""
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


def leaving_outcome(
    layout: JobLayout, manifest: Manifest, known_done: set[str] | frozenset[str], reader: SummaryReader | None
) -> tuple[bool, list[TerminalInfo]]:
    """:func:`job_outcome` from the summary when ``reader`` has a fresh one: complete when it shows
    every shard done (a ``done/`` listing, trusted as a worker's own listing is), and the terminal
    failures it names, each read by name.  A summary a few seconds old may say "not complete" for
    a job that just completed: callers then wait (settle), which reads the summary again."""
    view = reader.view() if reader is not None else None
    if view is None:
        return job_outcome(layout, manifest, known_done)
    return (True, []) if view.all_done else (False, terminal_infos(layout, sorted(view.failed)))


def terminal_infos(layout: JobLayout, shard_ids: Iterable[str]) -> list[TerminalInfo]:
    """The terminal failures among ``shard_ids`` (names from ``failed/`` or the summary: hints),
    each failed marker read by name; a name that is no shard id is skipped."""
    found = []
    for shard in shard_ids:
        try:
            markers = read_failed_marker(layout, Markers(shard))
        except ElasticError:  # a foreign file name in failed/
            continue
        if decide_state(markers) is ShardState.FAILED:
            found.append(markers.terminal_info)
    return found
