"""The ``dj-elastic`` options that set ``elastic.*`` values, generated from :class:`ElasticSettings`
(docs/architecture.md, "settings and the command line").  An option left out is None, so "not
given" is never confused with a value.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Final, Literal

from data_juicer_elastic.settings import ElasticSettings, field_help

# The elastic.* values each dj-elastic command takes as options: field -> this command's
# help text, None for the field's own.  In help order.
FROM_RECIPE, FROM_JOB = "the recipe's elastic: block", "the job's setting"  # where an option left out comes from
PREPARE_OPTIONS: Final = {
    "num_shards": None,
    "ray_address": None,
    "lease_ttl_secs": None,
    "max_retries": None,
    "poll_interval_secs": None,
    "copy_shards": None,
    "shard_codec": "how copied shards are stored (with --copy-shards)",
}
RUN_OPTIONS: Final = {
    "num_shards": None,
    "ray_address": None,
    "ray_num_cpus": "CPUs of each slot's 'local' Ray runtime",
    "run_id": "the submission's id, shared by all its instances",
    "nodes": "expected nodes (enforced with --require-all-nodes)",
    "require_all_nodes": "strict mode: every node must complete shards",
    "wait_timeout_secs": None,
    "slots_per_node": "shards processed at once on this node",
    "export_layout": None,
}
MERGE_OPTIONS: Final = {
    "export_layout": "file: one merged JSONL at OUTPUT; parts: OUTPUT is a directory of part files, one per shard, "
    "linked without copying (default: the job's elastic.export_layout, else file)",
}
WORKER_OPTIONS: Final = {
    "max_shards": "stop after claiming this many shards",
    "ray_address": "override the recorded Ray address (local | auto | host:port)",
    "ray_num_cpus": "CPUs of each slot's 'local' Ray runtime",
    "heartbeat_interval_secs": None,
    "lease_ttl_secs": None,
    "max_retries": None,
    "poll_interval_secs": None,
    "max_holder_deaths": None,
    "stall_timeout_secs": None,
    "allow_version_mismatch": None,
    "claim_ahead": "in a shard's tail, claim and read the next one (default: the job's elastic.claim_ahead, else on)",
    "max_error_rows": "rows operators failed on a shard may set aside (default: the job's elastic.max_error_rows)",
}


def add_setting_options(
    parser: argparse.ArgumentParser,
    options: Mapping[str, str | None],
    default_from: str,
    flags: Mapping[str, str] | None = None,
) -> None:
    """Add an option for each field in ``options`` (field name -> this command's help text, or
    None for the field's docstring followed by where the value comes from when the option is
    not given: ``default_from``, else the field's default).  ``flags`` renames an option."""
    hints, docs = typing.get_type_hints(ElasticSettings), field_help()
    defaults = {f.name: f.default for f in dataclasses.fields(ElasticSettings)}
    for name, text in options.items():
        flag = _flag(name, flags)
        if text is None:
            default = defaults[name]
            known = "" if default is None or default is dataclasses.MISSING else f", else {default}"
            text = f"{docs.get(name, '')} (default: {default_from}{known})".replace("%", "%%")
        hint = _inner_type(hints[name])
        if hint is bool:
            action = argparse.BooleanOptionalAction if defaults[name] else "store_true"
            parser.add_argument(flag, dest=name, action=action, default=None, help=text)
        elif typing.get_origin(hint) is Literal:
            parser.add_argument(flag, dest=name, choices=typing.get_args(hint), help=text)
        else:
            parser.add_argument(flag, dest=name, type=None if hint is str else hint, help=text)


def setting_args(settings: ElasticSettings, options: Mapping[str, str | None]) -> list[str]:
    """The options that give a command whose parser :func:`add_setting_options` built (with these
    ``options``, no renamed flags) the values of ``settings``.  A value no option states (None, and off
    for a switch off by default) is left out: the command takes it from where it takes an option
    not given (``dj-elastic worker``: the job's settings)."""
    hints = typing.get_type_hints(ElasticSettings)
    defaults = {f.name: f.default for f in dataclasses.fields(ElasticSettings)}
    argv: list[str] = []
    for name in options:
        flag, value = _flag(name, None), getattr(settings, name)
        if value is None:
            continue
        if _inner_type(hints[name]) is bool:
            if value or defaults[name]:
                argv.append(flag if value else "--no-" + flag.removeprefix("--"))
        else:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ``elastic.*`` values given as options (every settings field the command has and was set)."""
    values = {name: getattr(args, name, None) for name in ElasticSettings.field_names()}
    return {name: value for name, value in values.items() if value is not None}


def _flag(name: str, flags: Mapping[str, str] | None) -> str:
    return (flags or {}).get(name, "--" + name.replace("_", "-"))


def _inner_type(hint: Any) -> Any:
    """``X`` for ``X | None``; any other type as it is."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return inner
    return hint
