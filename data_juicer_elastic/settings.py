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
from typing import Any, Final, Literal

from data_juicer_elastic.errors import ConfigError

DEFAULT_LEASE_TTL_SECS: Final = 120.0
DEFAULT_MAX_RETRIES: Final = 3
DEFAULT_MAX_HOLDER_DEATHS: Final = 10
DEFAULT_STALL_TIMEOUT_SECS: Final = 300.0
DEFAULT_POLL_INTERVAL_SECS: Final = 2.0
DEFAULT_RAY_ADDRESS: Final = "local"
DEFAULT_WAIT_TIMEOUT_SECS: Final = 1800.0
MAX_RUN_ID_CHARS: Final = 256
DEFAULT_MAX_LINE_BYTES: Final = 64 * 1024 * 1024
SHARD_CODECS: Final = ("none", "gzip", "zstd")
INPUT_ORDERS: Final = ("sorted", "data_juicer")

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
    max_holder_deaths: int = DEFAULT_MAX_HOLDER_DEATHS
    """Deaths of a shard's holder (killed, preempted, lease expired, stalled) tolerated apart from max_retries."""
    stall_timeout_secs: float = DEFAULT_STALL_TIMEOUT_SECS
    """Give a running shard up and restart the runtime when it shows no progress and Ray no answer for this long."""
    allow_version_mismatch: bool = False
    """Let a worker whose Data-Juicer/plugin/Ray versions differ from the job's claim (operator code must match)."""
    poll_interval_secs: float = DEFAULT_POLL_INTERVAL_SECS
    """How often an idle worker looks again for claimable shards."""
    max_shards: int | None = None
    """Stop this worker after it has claimed this many shards (None: no limit)."""
    overwrite_output: bool = False
    """Replace a different existing file at export_path."""
    ray_num_cpus: int | None = None
    """CPUs for a 'local' Ray runtime (None: all of the node, divided among slots)."""
    run_id: str | None = None
    """Identity of one submission, shared by all its instances (None: the scheduler's job id, else derived)."""
    nodes: int | None = None
    """Expected number of nodes: informational in elastic mode, enforced with require_all_nodes."""
    require_all_nodes: bool = False
    """Strict mode: cap each node's share and fail unless `nodes` distinct nodes completed shards."""
    wait_timeout_secs: float = DEFAULT_WAIT_TIMEOUT_SECS
    """Fail when a shard has had no claimant for this long while this instance may not claim it (strict mode)."""
    slots_per_node: int = 1
    """Shards one node processes at once, each in its own worker process and Ray runtime (e.g. one per GPU)."""
    shard_codec: Literal["none", "gzip", "zstd"] = "none"
    """How input shards are stored in the job dir: 'none' (plain .jsonl), 'gzip' (.jsonl.gz) or 'zstd' (.jsonl.zst)."""
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    """Longest input line prepare accepts; longer lines are refused (memory grows with this bound)."""
    stream_merge: bool = False
    """Append each shard to <export_path>.partial once all shards before it are done (docs/input-format.md)."""
    input_order: Literal["sorted", "data_juicer"] = "sorted"
    """Order of the files of a directory input: 'sorted' by relative path, or 'data_juicer' (its default executor's)."""
    claim_ahead: bool = True
    """While a shard runs, claim the next one (at most one per slot, its lease renewed) and read it ahead."""

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
        if not _int_at_least(self.max_holder_deaths, 0):
            raise bad("max_holder_deaths", self.max_holder_deaths, "must be an integer >= 0")
        if not _positive(self.stall_timeout_secs):
            raise bad("stall_timeout_secs", self.stall_timeout_secs, "must be a number > 0")
        if not isinstance(self.allow_version_mismatch, bool):
            raise bad("allow_version_mismatch", self.allow_version_mismatch, "must be true or false")
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
        if self.run_id is not None and (
            not isinstance(self.run_id, str)
            or not self.run_id.strip()
            or len(self.run_id) > MAX_RUN_ID_CHARS
            or not self.run_id.isprintable()
        ):
            raise bad("run_id", self.run_id, f"must be a printable string of 1 to {MAX_RUN_ID_CHARS} characters")
        if self.nodes is not None and not _int_at_least(self.nodes, 1):
            raise bad("nodes", self.nodes, "must be an integer >= 1 or null")
        if not isinstance(self.require_all_nodes, bool):
            raise bad("require_all_nodes", self.require_all_nodes, "must be true or false")
        if not _positive(self.wait_timeout_secs):
            raise bad("wait_timeout_secs", self.wait_timeout_secs, "must be a number > 0")
        if not _int_at_least(self.slots_per_node, 1):
            raise bad("slots_per_node", self.slots_per_node, "must be an integer >= 1")
        if self.shard_codec not in SHARD_CODECS:
            raise bad("shard_codec", self.shard_codec, f"use one of {', '.join(SHARD_CODECS)}")
        if not _int_at_least(self.max_line_bytes, 1024):
            raise bad("max_line_bytes", self.max_line_bytes, "must be an integer >= 1024")
        if not isinstance(self.stream_merge, bool):
            raise bad("stream_merge", self.stream_merge, "must be true or false")
        if not isinstance(self.claim_ahead, bool):
            raise bad("claim_ahead", self.claim_ahead, "must be true or false")
        if self.input_order not in INPUT_ORDERS:
            raise bad("input_order", self.input_order, f"use one of {', '.join(INPUT_ORDERS)}")
        if self.require_all_nodes:
            if self.nodes is None:
                raise bad("nodes", self.nodes, "require_all_nodes needs the number of nodes (elastic.nodes)")
            check_strict_shares(self.num_shards, self.nodes, self.slots_per_node)

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


def check_strict_shares(num_shards: int, nodes: int, slots: int) -> int:
    """Shards each slot may complete in strict mode; ConfigError unless the shares are equal.

    With equal shares (``num_shards`` a multiple of ``nodes * slots``) every node must
    take part for the job to finish; with unequal ones some nodes could take all the
    work and a present node would be reported missing.
    """
    per_slot, rest = divmod(num_shards, nodes * slots)
    if per_slot < 1 or rest:
        raise ConfigError(
            f"invalid value {num_shards!r}: strict mode needs num_shards to be a multiple of "
            f"nodes x slots_per_node = {nodes * slots}",
            where="elastic.num_shards",
            hint=f"use num_shards {max(1, per_slot + (1 if rest else 0)) * nodes * slots}, or elastic mode",
        )
    return per_slot


def _int_at_least(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
