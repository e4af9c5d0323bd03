"""What ``dj-elastic status`` reads besides the job summary (``jobdir.job_summary``) when there is one.

With a summary, a status costs O(live claims + worker processes) metadata operations,
whatever the number of shards (``job_status`` reads the rest):

* the summary, and one listing each of ``done/``, ``failed/`` and ``failures/``: names only,
  trusted as the summary's writer trusts them (a shard finished after the summary was
  written is done all the same);
* the progress record of each shard the summary lists as a live claim and the listings do not
  settle (its claim, holder and staleness are the summary's: as its writer saw them, up to one
  summary interval ago); the records of each terminally failed shard;
* the workers' pace records (``jobdir.pace``: one listing, one read each) for the per-node
  counts of accepted results, rows and quarantined rows, fresher than the summary's copy.

Records are read a few at a time (each is a round trip to the server).  Never one read per
done shard: their owner, output rows and attempts are not known here (None).  A shard neither
done, failed nor live in the summary is PENDING without a read, so a claim made after the
summary was written shows as pending until the next summary (one summary interval, a few
seconds).
"""

from __future__ import annotations

from collections import defaultdict

from data_juicer_elastic.jobdir.job_summary import LiveClaim
from data_juicer_elastic.jobdir.leases import LeaseView
from data_juicer_elastic.jobdir.pace import PaceRecord
from data_juicer_elastic.status.snapshot_types import NodeTally


def node_tallies(paces: list[PaceRecord]) -> list[NodeTally]:
    """Accepted results, input and output rows, and quarantined rows per node,
    summed over its worker processes' pace records (``jobdir.pace.read_paces``; a missing or
    corrupt record counts nothing)."""
    records: dict[str, list] = defaultdict(list)
    for record in paces:
        records[record.node_id].append(record)
    tallies = []
    for node, found in sorted(records.items()):
        tallies.append(
            NodeTally(
                node,
                sum(r.done for r in found),
                sum(r.rows_out for r in found),
                sum(r.rows_in for r in found),
                sum(r.quarantined for r in found),
            )
        )
    return tallies


def vouched_stale(claim: LiveClaim | None, view: LeaseView) -> bool:
    """The summary's writer saw this very heartbeat value unchanged for a TTL (or its holder's pid
    gone on the writer's host), and it is still the value now: the rule a taker follows."""
    return claim is not None and claim.stale and claim.generation == view.generation and claim.token == view.token_text
