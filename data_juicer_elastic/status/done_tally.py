"""Accepted results per node for ``status`` from the job summary: the workers' pace records,
reconciled with the ``done/`` listing, so the per-node rows always add up to the done count.

A pace record counts its process's accepted results, up to one shard behind while it runs and
for good when the process was killed between publishing a done marker and recording it.  Such
a shard is still listed as held by that record (``PaceWriter.finished`` drops the claim and
counts the result in one change), so it is found without a read per done shard:

1. every done shard that a pace record still holds, with that record's attempt, is read from
   its done marker (one read each: at most one per worker process) and counted from it;
2. if the pace records and those markers still do not account for every name in ``done/``
   (a record lost or unreadable, a shard requeued by ``retry`` and done again, a listing behind
   the records), every done marker is read and the tallies are the markers' (what ``--all``
   does): exact, at one read per done shard, only in those cases.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.job_summary import PaceRecord
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import ShardResult
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import attempt_started_at
from data_juicer_elastic.status.snapshot_types import NodeTally


@dataclass
class _Tally:
    shards_done: int = 0
    output_rows: int = 0
    rows_done: int = 0
    quarantined: int = 0
    attempt_secs: float = 0.0

    def add(self, shards: int, output_rows: int, rows_done: int, quarantined: int, secs: float) -> None:
        self.shards_done += shards
        self.output_rows += output_rows
        self.rows_done += rows_done
        self.quarantined += quarantined
        self.attempt_secs += secs


def node_tallies(paces: Iterable[PaceRecord]) -> list[NodeTally]:
    """Accepted results, input and output rows, and quarantined rows per node, summed over its
    worker processes' pace records (a missing or corrupt record counts nothing)."""
    return _tallies(_pace_rows(paces))


def reconciled_tallies(
    layout: JobLayout, paces: list[PaceRecord], done: set[str], input_rows: Mapping[str, int]
) -> list[NodeTally]:
    """Per-node tallies whose shards add up to ``len(done)`` (the ``done/`` listing): the pace
    records, plus the done shards they still hold, or else every done marker (module doc)."""
    held = {(h.shard_id, h.attempt_id) for r in paces for h in r.held if h.shard_id in done}
    results = _results(layout, sorted({shard for shard, _ in held}))
    uncounted = [r for r in results if (r.shard_id, r.attempt_id) in held]
    if sum(r.done for r in paces) + len(uncounted) == len(done):
        return _tallies([*_pace_rows(paces), *_result_rows(uncounted, input_rows)])
    return _tallies(_result_rows(_results(layout, sorted(done)), input_rows))


def _results(layout: JobLayout, shards: list[str]) -> list[ShardResult]:
    """The accepted results of ``shards`` (read a few at a time); a corrupt or vanished marker is left out."""
    found = fsio.read_many(lambda shard: attempts.read_done(layout, shard)[0], shards)
    return [r for r in found if isinstance(r, ShardResult)]


def _pace_rows(paces: Iterable[PaceRecord]):
    return (
        (r.node_id, r.done, r.rows_out, r.rows_in, r.quarantined, (r.first_secs or 0.0) + r.warm_secs) for r in paces
    )


def _result_rows(results: Iterable[ShardResult], input_rows: Mapping[str, int]):
    for r in results:
        quarantined = r.errors.rows if r.errors is not None else 0
        started = attempt_started_at(r.attempt_id)  # the attempt id's stamp and the marker: one node's clock
        secs = max(0.0, r.published_at - started) if started is not None else 0.0
        yield r.node_id, 1, r.rows, input_rows.get(r.shard_id, r.input_rows), quarantined, secs


def _tallies(rows) -> list[NodeTally]:
    by_node: dict[str, _Tally] = defaultdict(_Tally)
    for node, *counts in rows:
        by_node[node].add(*counts)
    return [
        NodeTally(node, t.shards_done, t.output_rows, t.rows_done, t.quarantined, t.attempt_secs)
        for node, t in sorted(by_node.items())
    ]
