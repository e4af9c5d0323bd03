"""The lease, timing and limit values of one worker loop (``worker_loop.run_worker``), checked by the
settings' own rules (``settings.check_values``) when built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.settings import ElasticSettings, check_values


@dataclass(frozen=True)
class WorkerSettings:
    """What one worker loop holds to: its leases, its pace, its limits."""

    ttl_secs: float  # a claim whose heartbeat has not changed for this long is taken over
    heartbeat_secs: float  # how often the held claims' heartbeats are renewed
    max_retries: int  # retries after a shard's first failed attempt; then it is terminally failed
    poll_interval_secs: float  # how often an idle worker looks again (the summary may make it wait longer)
    max_shards: int | None = None  # stop after claiming this many shards (None: no limit)
    # stop once this many of this worker's results were accepted (strict mode's share): unlike
    # max_shards a failed attempt does not use it up (None: no limit)
    max_done: int | None = None
    # deaths of a shard's holders (killed, lease expired, stalled) that fail it, apart from max_retries
    max_holder_deaths: int | None = None  # None: never
    # give a shard up when its attempt shows no sign of life for this long (jobdir.liveness)
    stall_timeout_secs: float | None = None  # None: a heartbeat means alive
    wait_for_completion: bool = True  # with nothing claimable, wait for the shards others hold (else no-work)
    claim_ahead: bool = True  # in a shard's tail, claim the next one and check its input (jobdir.claim_ahead)
    random_start: bool = False  # start looking at a random shard (fresh workers spread out), else at the first
    job_summary: bool = True  # keep and read the job summary (jobdir.job_summary) instead of every shard

    def __post_init__(self) -> None:
        values: dict[str, Any] = {
            "lease_ttl_secs": self.ttl_secs,
            "heartbeat_interval_secs": self.heartbeat_secs,
            "max_retries": self.max_retries,
            "poll_interval_secs": self.poll_interval_secs,
            "max_shards": self.max_shards,
        }
        limits = {"max_holder_deaths": self.max_holder_deaths, "stall_timeout_secs": self.stall_timeout_secs}
        # the settings' own rules (a caller may pass plain values); None is "no limit" for the last two
        check_values(values | {name: value for name, value in limits.items() if value is not None})
        if self.max_done is not None and (isinstance(self.max_done, bool) or self.max_done < 1):
            raise ConfigError(f"invalid value {self.max_done!r}: must be >= 1 or null", where="max_done")

    @classmethod
    def from_elastic(cls, settings: ElasticSettings, **values: Any) -> WorkerSettings:
        """The values ``settings`` holds (``heartbeat_secs``: its interval, else a quarter of the
        TTL); ``values`` adds those only the caller knows (``max_done``, ``wait_for_completion``,
        ``random_start``, ``job_summary``)."""
        return cls(
            ttl_secs=settings.lease_ttl_secs,
            heartbeat_secs=settings.heartbeat_secs,
            max_retries=settings.max_retries,
            poll_interval_secs=settings.poll_interval_secs,
            max_shards=settings.max_shards,
            max_holder_deaths=settings.max_holder_deaths,
            stall_timeout_secs=settings.stall_timeout_secs,
            claim_ahead=settings.claim_ahead,
            **values,
        )
