"""The typed ``elastic:`` block of a recipe, and its validation: one dataclass behind the recipe block,
the ``dj-elastic`` options and the manifest's settings, so a setting has one name, one help text
(:func:`field_help`) and one validity rule (:func:`check_values`; docs/architecture.md, "settings
and the command line").
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, Literal

from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.rows.codecs import CODECS, Codec

DEFAULT_LEASE_TTL_SECS: Final = 120.0
DEFAULT_MAX_RETRIES: Final = 3
DEFAULT_POLL_INTERVAL_SECS: Final = 2.0
MAX_RUN_ID_CHARS: Final = 256
DEFAULT_MAX_LINE_BYTES: Final = 64 * 1024 * 1024
# Quarantined rows a shard may have: 1% of its input rows (rounded up).  Malformed rows are rare;
# an operator that fails on more is more likely broken (a missing model, a bug on a common case),
# and setting most of a corpus aside would be a silent loss by another name.
DEFAULT_MAX_ERROR_ROWS: Final = 0.01
InputOrder = Literal["sorted", "data_juicer"]
ExportLayoutName = Literal["file", "parts"]

# "local": a private runtime owned by the worker; "auto": a node-local head the user started; else host:port or ray://.
_RAY_ADDRESS = re.compile(r"^(local|auto|ray://[\w.\-]+:\d+|[\w.\-]+:\d+)$")


@dataclass(frozen=True)
class ElasticSettings:
    """Every tunable of the elastic_sharded executor (recipe key ``elastic.<name>``)."""

    job_dir: str
    """Shared job directory (NAS/NFS/CPFS) holding shards, claims, attempts and results."""
    num_shards: int = 8
    """Exact number of non-empty contiguous shards the input is split into."""
    ray_address: str = "local"
    """Node-local Ray: 'local' (a runtime owned by the worker), 'auto', or an address."""
    lease_ttl_secs: float = DEFAULT_LEASE_TTL_SECS
    """A claim whose heartbeat has not changed for this long is taken over."""
    heartbeat_interval_secs: float | None = None
    """Heartbeat period; default lease_ttl_secs / 4."""
    max_retries: int = DEFAULT_MAX_RETRIES
    """Retries after the first failed attempt; then the shard is terminally failed."""
    max_holder_deaths: int = 10
    """Deaths of a shard's holder (killed, preempted, lease expired, stalled) tolerated apart from max_retries."""
    stall_timeout_secs: float = 300.0
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
    wait_timeout_secs: float = 1800.0
    """Fail when a shard has had no claimant for this long while this instance may not claim it (strict mode)."""
    slots_per_node: int = 1
    """Shards one node processes at once, each in its own worker process and Ray runtime (e.g. one per GPU)."""
    copy_shards: bool = False
    """Scans copy each shard into the job dir (immune to later input changes); else shards are read in place."""
    shard_codec: Codec = "none"
    """How copied shards are stored: 'none' (.jsonl), 'gzip' (.jsonl.gz) or 'zstd' (.jsonl.zst: copies them)."""
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    """Longest input line prepare accepts; longer lines are refused (memory grows with this bound)."""
    stream_merge: bool = True
    """With export_layout 'file': append each shard to <export_path>.partial as soon as all shards before it are
    done, while the job runs, so finalize appends only the tail (docs/output-layouts.md)."""
    export_layout: ExportLayoutName = "file"
    """'file': one JSONL at export_path; 'parts': export_path is a directory of ordered part files, one per shard,
    published without copying (docs/output-layouts.md)."""
    input_order: InputOrder = "sorted"
    """Order of the files of a directory input: 'sorted' by relative path, or 'data_juicer' (its default executor's)."""
    claim_ahead: bool = True
    """While a shard runs, claim the next one (at most one per slot, its lease renewed) and read it ahead."""
    max_error_rows: float = DEFAULT_MAX_ERROR_ROWS
    """Rows operators failed on that a shard may set aside (quarantine): a count (>= 1), or a fraction (< 1)
    of the shard's input rows, rounded up; more fail the shard."""

    def __post_init__(self) -> None:
        check_values(vars(self))

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
            guesses = [f"{name} -> {guess}" for name in unknown if (guess := closest_key(name))]
            raise ConfigError(
                f"unknown key(s) {', '.join(unknown)}",
                where="elastic",
                hint=(f"did you mean {', '.join(guesses)}? " if guesses else "")
                + f"valid keys: {', '.join(cls.field_names())}",
            )
        if "job_dir" not in values or values["job_dir"] in (None, ""):
            raise ConfigError(
                "job_dir is required", where="elastic.job_dir", hint="set elastic.job_dir to a shared directory"
            )
        return cls(**{k: v for k, v in values.items() if v is not None or k in ("heartbeat_interval_secs",)})


def closest_key(name: str) -> str | None:
    """The ``elastic:`` key a mistyped ``name`` most likely means (``num_shard`` -> ``num_shards``), or None."""
    found = difflib.get_close_matches(name, ElasticSettings.field_names(), n=1, cutoff=0.6)
    return found[0] if found else None


@cache
def field_help() -> dict[str, str]:
    """Each field's help text: the attribute docstring right after it in :class:`ElasticSettings`
    (the recipe's ``--elastic.<field>`` arguments and the ``dj-elastic`` options show it)."""
    try:
        tree = ast.parse(inspect.getsource(ElasticSettings))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, following in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def check_strict_shares(num_shards: int, nodes: int, slots: int) -> int:
    """Shards each slot may complete in strict mode; ConfigError unless the shares are equal (with
    unequal ones some nodes could take all the work, and a present node would be reported missing)."""
    per_slot, rest = divmod(num_shards, nodes * slots)
    if per_slot < 1 or rest:
        raise ConfigError(
            f"invalid value {num_shards!r}: strict mode needs num_shards to be a multiple of "
            f"nodes x slots_per_node = {nodes * slots}",
            where="elastic.num_shards",
            hint=f"use num_shards {max(1, per_slot + (1 if rest else 0)) * nodes * slots}, or elastic mode",
        )
    return per_slot


# -- the rules ---------------------------------------------------------------------------------
# One rule per key, checked in this order (the first bad value is the one reported): a test of
# the value (and, for relations, of the other values given) and the words that say what is valid.
_Rule = tuple[Callable[[Any, Mapping[str, Any]], bool], str]


def _integer(minimum: int, *, or_null: bool = False) -> _Rule:
    words = f"must be an integer >= {minimum}" + (" or null" if or_null else "")
    fits = lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= minimum  # noqa: E731
    return (lambda value, _: (or_null and value is None) or fits(value)), words


_POSITIVE: Final[_Rule] = ((lambda value, _: _positive(value)), "must be a number > 0")
_SWITCH: Final[_Rule] = ((lambda value, _: isinstance(value, bool)), "must be true or false")


def _one_of(choices: tuple[str, ...]) -> _Rule:
    return (lambda value, _: value in choices), f"use one of {', '.join(choices)}"


def _heartbeat_fits(value: Any, values: Mapping[str, Any]) -> bool:
    ttl = values.get("lease_ttl_secs")  # the relation is checked when the TTL is given too
    return value is None or (_positive(value) and (ttl is None or value * 2 < ttl))


def _run_id_fits(value: Any, _: Mapping[str, Any]) -> bool:
    return value is None or (
        isinstance(value, str) and bool(value.strip()) and len(value) <= MAX_RUN_ID_CHARS and value.isprintable()
    )


_RULES: Final[dict[str, _Rule]] = {
    "job_dir": (lambda value, _: isinstance(value, str) and bool(value.strip()), "a shared directory path is required"),
    "num_shards": _integer(1),
    "ray_address": (
        lambda value, _: isinstance(value, str) and bool(_RAY_ADDRESS.match(value)),
        "use 'local', 'auto', host:port or ray://host:port",
    ),
    "lease_ttl_secs": _POSITIVE,
    "heartbeat_interval_secs": (_heartbeat_fits, "must be > 0 and < lease_ttl_secs / 2"),
    "max_retries": _integer(0),
    "max_holder_deaths": _integer(0),
    "stall_timeout_secs": _POSITIVE,
    "allow_version_mismatch": _SWITCH,
    "poll_interval_secs": _POSITIVE,
    "max_shards": _integer(1, or_null=True),
    "ray_num_cpus": _integer(1, or_null=True),
    "run_id": (_run_id_fits, f"must be a printable string of 1 to {MAX_RUN_ID_CHARS} characters"),
    "nodes": _integer(1, or_null=True),
    "require_all_nodes": _SWITCH,
    "wait_timeout_secs": _POSITIVE,
    "slots_per_node": _integer(1),
    "copy_shards": _SWITCH,
    "shard_codec": _one_of(CODECS),
    "max_line_bytes": _integer(1024),
    "stream_merge": _SWITCH,
    "export_layout": _one_of(typing.get_args(ExportLayoutName)),
    "claim_ahead": _SWITCH,
    "input_order": _one_of(typing.get_args(InputOrder)),
    "max_error_rows": (
        lambda value, _: (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value >= 0
            and (value < 1 or float(value).is_integer())
        ),
        "must be a fraction of a shard's rows (0 to below 1) or a whole count (>= 1)",
    ),
}


def check_values(values: Mapping[str, Any]) -> None:
    """ConfigError naming ``elastic.<key>`` for the first of ``values`` that breaks its rule, whoever
    holds them (the settings object, or code taking some as plain arguments).  A relation is checked
    when its values are all given (``heartbeat_interval_secs`` needs ``lease_ttl_secs``)."""
    for name, (fits, words) in _RULES.items():
        if name in values and not fits(values[name], values):
            raise _invalid(name, values[name], words)
    if values.get("require_all_nodes"):
        if values.get("nodes") is None:
            raise _invalid("nodes", None, "require_all_nodes needs the number of nodes (elastic.nodes)")
        check_strict_shares(values["num_shards"], values["nodes"], values["slots_per_node"])


def _invalid(name: str, value: Any, rule: str) -> ConfigError:
    return ConfigError(
        f"invalid value {value!r}: {rule}",
        where=f"elastic.{name}",
        hint="fix the recipe's elastic: block or the matching command-line option",
    )


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
