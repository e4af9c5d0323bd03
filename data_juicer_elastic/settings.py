"""The typed ``elastic:`` block of a recipe, and its validation.

The same dataclass backs the recipe block (added to Data-Juicer's parser by
``integration.config_block``), the ``dj-elastic`` options and the values stored
in a job's manifest, so a setting has one name and one validity rule.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from data_juicer_elastic.errors import ConfigError

DEFAULT_LEASE_TTL_SECS: Final = 120.0
DEFAULT_MAX_RETRIES: Final = 3
DEFAULT_POLL_INTERVAL_SECS: Final = 2.0
DEFAULT_RAY_ADDRESS: Final = "local"

# "local" starts a private runtime owned by the worker; "auto" attaches to a
# node-local head the user started; anything else must look like host:port or
# a ray:// URL.
_RAY_ADDRESS = re.compile(r"^(local|auto|ray://[\w.\-]+:\d+|[\w.\-]+:\d+)$")


@dataclass(frozen=True)
class ElasticSettings:
    """Every tunable of the elastic_sharded executor (recipe key ``elastic.<name>``)."""

    job_dir: str
    """Shared job directory (NAS/NFS/CPFS) holding shards, claims, attempts and results."""
    num_shards: int = 8
    """Exact number of non-empty contiguous shards the input is split into."""
    ray_address: str = DEFAULT_RAY_ADDRESS
    """Node-local Ray: 'local' (a runtime owned by the worker), 'auto', or an address."""
    lease_ttl_secs: float = DEFAULT_LEASE_TTL_SECS
    """A claim whose heartbeat has not changed for this long is taken over."""
    heartbeat_interval_secs: float | None = None
    """Heartbeat period; default lease_ttl_secs / 4."""
    max_retries: int = DEFAULT_MAX_RETRIES
    """Retries after the first failed attempt; then the shard is terminally failed."""
    poll_interval_secs: float = DEFAULT_POLL_INTERVAL_SECS
    """How often an idle worker looks again for claimable shards."""
    max_shards: int | None = None
    """Stop this worker after it has claimed this many shards (None: no limit)."""
    overwrite_output: bool = False
    """Replace a different existing file at export_path."""
    ray_num_cpus: int | None = None
    """CPUs for a 'local' Ray runtime (None: all of the node)."""

    def __post_init__(self) -> None:
        def bad(name: str, value: Any, rule: str) -> ConfigError:
            return ConfigError(
                f"invalid value {value!r}: {rule}",
                where=f"elastic.{name}",
                hint="fix the recipe's elastic: block or the matching command-line option",
            )

        if not isinstance(self.job_dir, str) or not self.job_dir.strip():
            raise bad("job_dir", self.job_dir, "a shared directory path is required")
        if isinstance(self.num_shards, bool) or not isinstance(self.num_shards, int) or self.num_shards < 1:
            raise bad("num_shards", self.num_shards, "must be an integer >= 1")
        if not isinstance(self.ray_address, str) or not _RAY_ADDRESS.match(self.ray_address):
            raise bad("ray_address", self.ray_address, "use 'local', 'auto', host:port or ray://host:port")
        if not _positive(self.lease_ttl_secs):
            raise bad("lease_ttl_secs", self.lease_ttl_secs, "must be a number > 0")
        if self.heartbeat_interval_secs is not None and not (
            _positive(self.heartbeat_interval_secs) and self.heartbeat_interval_secs * 2 < self.lease_ttl_secs
        ):
            raise bad("heartbeat_interval_secs", self.heartbeat_interval_secs, "must be > 0 and < lease_ttl_secs / 2")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise bad("max_retries", self.max_retries, "must be an integer >= 0")
        if not _positive(self.poll_interval_secs):
            raise bad("poll_interval_secs", self.poll_interval_secs, "must be a number > 0")
        if self.max_shards is not None and (
            isinstance(self.max_shards, bool) or not isinstance(self.max_shards, int) or self.max_shards < 1
        ):
            raise bad("max_shards", self.max_shards, "must be an integer >= 1 or null")
        if self.ray_num_cpus is not None and (
            isinstance(self.ray_num_cpus, bool) or not isinstance(self.ray_num_cpus, int) or self.ray_num_cpus < 1
        ):
            raise bad("ray_num_cpus", self.ray_num_cpus, "must be an integer >= 1 or null")

    @property
    def heartbeat_secs(self) -> float:
        return self.heartbeat_interval_secs or self.lease_ttl_secs / 4

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ElasticSettings:
        """Build from a recipe's ``elastic`` mapping; unknown keys are an error."""
        unknown = sorted(set(values) - set(cls.field_names()))
        if unknown:
            raise ConfigError(
                f"unknown key(s) {', '.join(unknown)}",
                where="elastic",
                hint=f"valid keys: {', '.join(cls.field_names())}",
            )
        if "job_dir" not in values or values["job_dir"] in (None, ""):
            raise ConfigError(
                "job_dir is required", where="elastic.job_dir", hint="set elastic.job_dir to a shared directory"
            )
        return cls(**{k: v for k, v in values.items() if v is not None or k in ("heartbeat_interval_secs",)})

    def replace(self, **changes: Any) -> ElasticSettings:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
