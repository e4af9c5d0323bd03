"""The reason codes written in the job directory's records: every allowed value, once.

Each is a ``StrEnum`` whose values are the exact strings the records carry, so a record
encodes the same bytes as with plain strings and a member compares equal to its string.  Parsing a
record (``jobdir.records``) turns a known value into its member and keeps an unknown one
as the plain string a newer writer of the same version wrote (never a parse error).
"""

from __future__ import annotations

import enum
from typing import Final


class TakeoverReason(enum.StrEnum):
    """Why generation N of a shard could be claimed over (``Claim.takeover_reason``)."""

    FIRST = "none"  # the first claim of the shard
    RELEASED = "released"  # its holder released it
    FAILED = "failed"  # a failure record exists for it
    STALE = "stale"  # its heartbeat did not change for a TTL on the claimer's clock
    HOLDER_DEAD = "dead-pid"  # its holder's pid is gone in the claimer's own kernel and pid namespace
    RETRY = "retry"  # `dj-elastic retry` requeued the shard (jobdir.retry)


class ReleaseReason(enum.StrEnum):
    """Why a holder gave its generation up (``Release.reason``)."""

    FINISHED = "finished"  # the shard is published (by us or by another attempt): free only once stale
    FAILED = "failed"  # the attempt failed (a failure record exists too)
    SIGNAL = "signal"  # SIGTERM/SIGINT
    ABANDONED = "abandoned"  # the lease was lost: the attempt did not publish
    RETRY = "retry"  # `dj-elastic retry` requeued the shard
    WORKER_FAULT = "worker-fault"  # this worker cannot run shards (its set-up, not the shard)
    STALLED = "stalled"  # the attempt showed no sign of life for the stall timeout
    UNRUN = "unrun"  # claimed ahead and handed back without running (jobdir.claiming.ClaimAhead)
    LEFT = "left"  # the job summary's writer is leaving (jobdir.summary_keeper): the next may write at once


class FailureReason(enum.StrEnum):
    """Why a generation failed (``Failure.exit_reason``)."""

    ERROR = "error"  # the shard's execution raised: counts against max_retries
    LEASE_EXPIRED = "lease-expired"  # its holder stopped renewing (killed, lost, hung)
    HOLDER_DEAD = "holder-dead"  # its holder's pid vanished on the observer's host
    STALLED = "stalled"  # its attempt showed no sign of life for the stall timeout


# Failures whose holder died or stopped: evidence against the node, not the shard, so they have a
# budget of their own (max_holder_deaths); every other failure counts against max_retries.
DEATH_REASONS: Final = frozenset({FailureReason.LEASE_EXPIRED, FailureReason.HOLDER_DEAD, FailureReason.STALLED})


class AttemptExit(enum.StrEnum):
    """How an attempt ended (``AttemptRecord.exit_reason``)."""

    DONE = "done"  # its result is the shard's accepted result
    DISCARDED = "discarded"  # finished, but another attempt had published first
    FAILED = "failed"  # the shard's processing failed
    LOST = "lost"  # the lease was lost: abandoned without publishing
    SIGNAL = "signal"  # interrupted by SIGTERM/SIGINT (or SystemExit)
    WORKER_FAULT = "worker-fault"  # this worker cannot run shards


class StopReason(enum.StrEnum):
    """Why a worker loop returned (``WorkerSummary.stop_reason``; empty until it stops)."""

    FINISHED = "finished"  # every shard is done or failed for good
    MAX_SHARDS = "max_shards"  # it claimed its max_shards
    MAX_DONE = "max_done"  # its max_done results were accepted (strict mode's share)
    NO_WORK = "no_work"  # nothing claimable and not waiting for completion
    STOPPED = "stopped"  # its stop event was set
    INTERRUPTED = "interrupted"  # a signal whose previous handler chose not to exit
