"""The Data-Juicer recipe each shard runs (``executor_type: ray``), derived once from the user's parsed
recipe: what it keeps, drops and makes absolute is in docs/architecture.md, "integration".
"""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any, Final

from data_juicer_elastic.compat.dj_config_internals import base_parser
from data_juicer_elastic.errors import RecipeError
from data_juicer_elastic.integration.config_block import BLOCK, cfg_value, parsed_cfg
from data_juicer_elastic.jobdir.records import canonical_json, manifest_recipe_hash
from data_juicer_elastic.rows.jsonl import DEFAULT_MEDIA_KEYS

SHARD_EXECUTOR_TYPE: Final = "ray"

ALWAYS: Final = ("np", "text_keys", "image_key", "image_bytes_key", "audio_key", "video_key", "skip_op_error")

DROPPED: Final = frozenset(
    (BLOCK, "config", "executor_type", "auto", "auto_num", "hpo_config", "process")  # the job's; process: below
    + ("dataset_path", "dataset", "generated_dataset_config")  # the input: each shard is its own
    + ("export_path", "export_shard_size", "export_in_parallel", "export_extra_args", "export_aws_credentials")
    + ("work_dir", "job_id", "resume", "event_log_dir", "checkpoint_dir", "backed_up_config_path")  # per attempt
    + ("partition_dir", "partition", "partition_size")  # ray_partitioned's
    + ("ray_address",)  # the node-local runtime is elastic.ray_address
)

# Attributes init_setup_from_cfg writes into every operator (config.py, op_attrs).
INJECTED_OP_ATTRS: Final = {
    "text_key": "text_keys",
    "image_key": "image_key",
    "audio_key": "audio_key",
    "video_key": "video_key",
    "image_bytes_key": "image_bytes_key",
    "turbo": "turbo",
    "skip_op_error": "skip_op_error",
    "auto_op_parallelism": "auto_op_parallelism",
    "num_proc": "np",
}
ALWAYS_DROPPED_OP_ATTRS: Final = frozenset({"work_dir"})
PATH_KEYS: Final = ("custom_operator_paths", "ds_cache_dir", "temp_dir")


def build_shard_recipe(cfg: Any) -> dict:
    """The shard recipe of a parsed elastic cfg (rules: docs/architecture.md, "integration")."""
    parsed = parsed_cfg(cfg)
    # A cfg that did not come through init_configs (built by hand): its own values stand in for
    # the parsed ones; Data-Juicer's node-specific cache default is then indistinguishable from a
    # user setting and is left out.
    source = parsed if parsed is not None else cfg
    operator_names = _operator_names(cfg_value(source, "process", None), cfg_value(cfg, "process", None))
    defaults = _parser_defaults()

    recipe: dict[str, Any] = {}
    for key, value in _flat_items(source):
        top = key.split(".", 1)[0]
        if key.startswith("_") or top in DROPPED or top in operator_names:
            continue
        if parsed is None and key == "ds_cache_dir":
            continue
        if key in ALWAYS or key not in defaults or not _same(value, defaults[key]):
            _set_nested(recipe, key, value)
    for key in PATH_KEYS:
        if recipe.get(key):
            value = recipe[key]
            recipe[key] = [os.path.abspath(v) for v in value] if isinstance(value, list) else os.path.abspath(value)
    recipe["executor_type"] = SHARD_EXECUTOR_TYPE
    recipe["process"] = _shard_process(cfg, source)
    return canonical(recipe)


def recipe_hash(recipe: dict) -> str:
    """The job's recipe identity; one definition, shared with the manifest (jobdir.records)."""
    return manifest_recipe_hash(canonical(recipe))


def canonical(recipe: dict) -> dict:
    """Plain JSON types (tuples become lists, ...) with sorted keys; a value JSON cannot hold
    (an object, NaN, Infinity) is refused, naming it."""

    def refuse(value):
        raise RecipeError(
            f"value {value!r} of type {type(value).__name__} cannot be stored in the shard recipe",
            where="recipe",
            hint="use plain strings, numbers, booleans, lists and mappings in the recipe",
        )

    try:
        return json.loads(canonical_json(recipe, default=refuse))
    except ValueError as exc:  # NaN / Infinity: not portable JSON
        raise RecipeError(f"the recipe holds a non-finite number: {exc}", where="recipe") from exc


def media_keys(cfg: Any) -> dict[str, str]:
    """Recipe setting -> row field holding media paths: ``{"image_key": "images", ...}``."""
    return {key: cfg_value(cfg, key, default) for key, default in DEFAULT_MEDIA_KEYS.items()}


def index_key(cfg: Any) -> str | None:
    """The ``index_key`` operators in the process list declare (None if none does); preparation
    fills it with the global input row index where missing.  Two different fields are refused."""
    found: dict[str, str] = {}
    for position, (name, args) in enumerate(op_entries(cfg_value(cfg, "process", None) or [])):
        value = (args or {}).get("index_key")
        if value is not None:
            found.setdefault(value, f"process[{position}] {name}")
    if len(found) > 1:
        raise RecipeError(
            f"operators declare different index_key fields: {', '.join(f'{v} ({k!r})' for k, v in found.items())}",
            where="process",
            hint="use one index_key for every operator in the recipe",
        )
    return next(iter(found), None)


def _shard_process(cfg: Any, source: Any) -> list[dict]:
    final = cfg_value(cfg, "process", None)
    if not final:
        raise RecipeError(
            "the recipe has no process list",
            where="process",
            hint="list the Mapper/Filter operators explicitly under process:",
        )
    raw_ops = list(op_entries(cfg_value(source, "process", None) or [])) if source is not cfg else []
    shard_ops = []
    for position, (name, args) in enumerate(op_entries(final)):
        args = dict(args or {})
        user_set = position < len(raw_ops) and raw_ops[position][0] == name
        user = (raw_ops[position][1] or {}) if user_set else {}
        for key in ALWAYS_DROPPED_OP_ATTRS:
            args.pop(key, None)
        for key, global_key in INJECTED_OP_ATTRS.items():
            if key in args and user.get(key) is None and _same(args[key], _injected_value(cfg, global_key)):
                del args[key]
        shard_ops.append({name: args})
    return shard_ops


def _injected_value(cfg: Any, global_key: str) -> Any:
    value = cfg_value(cfg, global_key, None)
    if global_key == "text_keys" and isinstance(value, list):
        return value[0] if value else None
    return value


def op_entries(process: list) -> list[tuple[str, dict | None]]:
    """``[(operator name, its arguments)]`` of a process list; RecipeError naming an entry that is not
    a one-key mapping."""
    ops = []
    for position, entry in enumerate(process):
        if not isinstance(entry, dict) or len(entry) != 1:
            raise RecipeError(
                f"entry {entry!r} is not a one-key mapping",
                where=f"process[{position}]",
                hint="write each operator as `- op_name: {arg: value}`",
            )
        ((name, args),) = entry.items()
        if args is not None and hasattr(args, "as_dict"):
            args = args.as_dict()
        ops.append((name, args))
    return ops


def _flat_items(cfg: Any):
    # A jsonargparse Namespace gives its items with flattened dotted keys already.
    return cfg.items() if hasattr(cfg, "items") and hasattr(cfg, "as_dict") else _flatten(dict(cfg))


def _flatten(data: dict, prefix: str = ""):
    for key, value in data.items():
        if isinstance(value, dict) and value and key != "process":
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _set_nested(recipe: dict, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = recipe
    for part in parents:
        node = node.setdefault(part, {})
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    node[leaf] = value


def _same(a: Any, b: Any) -> bool:
    try:
        return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return a == b


@cache
def _parser_defaults() -> dict[str, Any]:
    return dict(base_parser().get_defaults().items())


def _operator_names(*processes: Any) -> set[str]:
    # Not cached: custom_operator_paths register more operators at parse time.
    from data_juicer.ops import OPERATORS

    names = set(OPERATORS.modules)
    for process in processes:
        names.update(name for name, _ in op_entries(process or []))
    return names
