"""What ``dj-elastic status`` reads besides the job summary (``jobdir.job_summary``) when there is one.

With a summary, a status costs O(live claims + worker processes) metadata operations,
whatever the number of shards (``job_status`` reads the rest):

* the summary, and one listing each of ``done/``, ``failed/`` and ``failures/``: names only,
  trusted as the summary's writer trusts them (a shard finished after the summary was
  written is done all the same);
* the lease, heartbeat mtime and progress record of each shard the summary lists as a live
  claim and the listings do not settle; the records of each terminally failed shard;
* the workers' pace records (``jobdir.pace``: one listing, one read each) for the per-node
  counts of accepted results and output rows, fresher than the summary's copy of them.

Never one read per done shard: their owner, output rows, attempts and quarantined rows are
not known here (None).  A shard neither done, failed nor live in the summary is PENDING
without a read, so a claim made after the summary was written shows as pending until the
next summary (one summary interval, a few seconds).
"""

from __future__ import annotations

from collections import defaultdict

from data_juicer_elastic.jobdir.job_summary import LiveClaim
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.leases import LeaseView
from data_juicer_elastic.jobdir.pace import read_pace
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.status.snapshot_types import NodeTally


def node_tallies(layout: JobLayout) -> list[NodeTally]:
    """Accepted results and output rows per node, summed over its worker processes' pace records
    (one listing of ``paces/``, one read per record; a missing or corrupt record counts nothing)."""
    done: dict[str, int] = defaultdict(int)
    rows: dict[str, int] = defaultdict(int)
    for name in fsio.list_names(layout.paces_dir):
        record = read_pace(layout, name)
        if record is None:
            continue
        done[record.node_id] += record.done
        rows[record.node_id] += record.rows_out
    return [NodeTally(node, done[node], rows[node]) for node in sorted(done)]


def vouched_stale(claim: LiveClaim | None, view: LeaseView) -> bool:
    """The summary's writer saw this very heartbeat value unchanged for a TTL (or its holder's pid
    gone on the writer's host), and it is still the value now: the rule a taker follows."""
    return claim is not None and claim.stale and claim.generation == view.generation and claim.token == view.token_text
