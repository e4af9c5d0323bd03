"""The Data-Juicer recipe each shard runs (``executor_type: ray``), derived once from the user's parsed
recipe: what it keeps, drops and makes absolute is in docs/architecture.md, "integration".

Recipes that cannot be run shard by shard are refused (README.md, "What a recipe may contain"):
each shard runs the recipe on a contiguous slice of the input, so only per-sample Mappers and
Filters are safe, besides the deduplicators run across shards (``integration.dedup_check``), and a
``stats_export_path`` would be written by every shard at once.  And an
elastic job's input is a local file or folder that exists (:func:`check_dataset_path`).
"""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.compat import dj_config_internals
from data_juicer_elastic.compat.dj_config_internals import base_parser
from data_juicer_elastic.errors import ConfigError, InputError, RecipeError
from data_juicer_elastic.integration.config_block import BLOCK, cfg_value, parsed_cfg
from data_juicer_elastic.integration.dedup_check import check_deduplicator, is_deduplicator
from data_juicer_elastic.jobdir.layout import resolve_user_path
from data_juicer_elastic.jobdir.manifest import manifest_recipe_hash
from data_juicer_elastic.jobdir.records import canonical_json
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


SHARD_SAFE: Final = ("Mapper", "Filter")  # and the deduplicators of integration.dedup_check
REFUSED_KINDS: Final = ("Deduplicator", "Selector", "Grouper", "Aggregator", "Pipeline")
_WHY = {
    "Selector": "selection ranks or samples the whole dataset, so each shard would select from itself only",
    "Grouper": "grouping gathers rows from the whole dataset into batches",
    "Aggregator": "aggregation combines rows of a group across the whole dataset",
    "Pipeline": "pipelines run their own dataset-level stages",
}
_WHAT_TO_DO = (
    "run this operator in a separate Data-Juicer job on the merged output (e.g. `dj-process --config global.yaml "
    "--dataset_path <export_path>`), and keep only Mapper/Filter operators in the elastic recipe"
)


def check_shard_safe(recipe: dict) -> list[str]:
    """Raise RecipeError naming the first unsafe operator or setting; return warnings.  Custom
    operators are resolved after loading ``custom_operator_paths`` (once per process)."""
    process = recipe.get("process")
    if not isinstance(process, list) or not process:
        raise RecipeError(
            "the recipe has no explicit process list",
            where="process",
            hint="list the Mapper/Filter operators under process:",
        )
    _check_globals(recipe)
    dj_config_internals.load_custom_operators(recipe.get("custom_operator_paths") or [])

    from data_juicer.ops import OPERATORS

    warnings: list[str] = []
    for position, (name, args) in enumerate(op_entries(process)):
        where = f"process[{position}] {name}"
        op_class = OPERATORS.modules.get(name)
        if op_class is None:
            raise RecipeError(
                "unknown operator",
                where=where,
                hint="check the spelling, or list the file/package that registers it in custom_operator_paths",
            )
        kind = operator_kind(op_class)
        args = args or {}
        if is_deduplicator(op_class, kind):
            warning = check_deduplicator(position, name, op_class, args)
            if warning:
                logger.warning(warning)
                warnings.append(warning)
        elif kind not in SHARD_SAFE:
            why = _WHY.get(kind, "only Mapper and Filter operators are per-sample")
            raise RecipeError(f"{kind or 'this operator type'} is not shard-safe: {why}", where=where, hint=_WHAT_TO_DO)
        _refuse_stats_export(args, f"{where}.stats_export_path")
        if args.get("save_dir"):
            message = (
                f"{where}: save_dir {args['save_dir']!r} is shared by every shard; "
                "make sure generated file names cannot collide across shards"
            )
            logger.warning(message)
            warnings.append(message)
    return warnings


def check_export(
    export_path: str, export_type: str | None, export_shard_size: float | None, layout: str = "file"
) -> None:
    """The export settings Data-Juicer's default executor honours and this executor cannot honour
    exactly are refused up front: the export is one JSONL file (``layout`` file, docs/lossless.md)
    or a directory of JSONL parts, one per shard (``parts``, docs/output-layouts.md)."""
    name = os.path.basename(export_path.rstrip("/"))
    suffix = name.rsplit(".", 1)[-1].lower() if "." in name else None
    if layout == "parts":
        if export_type and export_type != "jsonl":
            raise RecipeError(
                f"the parts would be {export_type!r}: elastic_sharded writes JSONL parts",
                where="export_type",
                hint="remove export_type (or set it to jsonl)",
            )
        if suffix in ("jsonl", "json", "parquet", "csv", "tsv", "txt", "gz", "zst"):
            raise RecipeError(
                f"export_path {export_path!r} names a .{suffix} file, but export_layout parts writes a directory "
                "of part files there",
                where="export_path",
                hint="name the directory to write, e.g. outputs/<job>/parts, or set elastic.export_layout: file",
            )
    else:
        kind = export_type or suffix
        if kind != "jsonl":
            raise RecipeError(
                f"the export would be {kind or 'of unknown type'!r}: elastic_sharded writes one JSONL file "
                "(Data-Juicer's default executor writes a JSON array for .json and Parquet for .parquet)",
                where="export_type" if export_type else "export_path",
                hint="use an export_path ending in .jsonl (or set elastic.export_layout: parts for a directory of "
                "parts), and convert the output afterwards if needed",
            )
    if export_shard_size and export_shard_size > 0:
        raise RecipeError(
            f"export_shard_size={export_shard_size} would split the export into files by their in-memory Arrow "
            "size, which elastic_sharded does not do",
            where="export_shard_size",
            hint="remove export_shard_size; elastic.export_layout: parts writes one part per shard "
            "(docs/output-layouts.md)",
        )


def operator_kind(op_class: type) -> str | None:
    """``"Mapper"``, ``"Filter"``, ... by Data-Juicer's base classes (first match in MRO order)."""
    from data_juicer.ops import base_op

    for base in op_class.__mro__:
        for kind in (*SHARD_SAFE, *REFUSED_KINDS):
            if base is getattr(base_op, kind, None):
                return kind
    return None


def _refuse_stats_export(settings: dict, where: str) -> None:
    if settings.get("stats_export_path"):
        raise RecipeError(
            "stats_export_path is set: every shard would write the same statistics file",
            where=where,
            hint="remove it; the merged output keeps every row's stats and finalize writes overall statistics "
            "(docs/analysis.md)",
        )


def _check_globals(recipe: dict) -> None:
    _refuse_stats_export(recipe, "stats_export_path")
    for key in ("encrypt_before_export", "decrypt_after_reading"):
        if recipe.get(key):
            raise RecipeError(
                "encrypted input/output is not supported by elastic_sharded (shards are plaintext JSONL)",
                where=key,
                hint=f"remove {key}, or run this recipe with a built-in executor",
            )
    if recipe.get("elastic_juicer_profile_seed"):
        raise RecipeError(
            "elastic_juicer_profile_seed requires executor_type ray_partitioned; shards run executor_type ray",
            where="elastic_juicer_profile_seed",
            hint="remove it",
        )
    if recipe.get("elastic_juicer_adaptive_batching") and recipe.get("op_fusion"):
        raise RecipeError(
            "elastic_juicer_adaptive_batching requires op_fusion: false",
            where="op_fusion",
            hint="set op_fusion: false or turn adaptive batching off",
        )


def check_dataset_path(cfg: Any) -> None:
    """An elastic job's input is a local file or folder: refused here when it is not set or not there
    (before Data-Juicer's setup, which would first warn that it takes the path for a remote dataset)."""
    dataset = cfg_value(cfg, "dataset_path", None)
    if not dataset:
        raise ConfigError("dataset_path is not set", where="recipe", hint="set dataset_path to a .jsonl file or folder")
    if not resolve_user_path(dataset).exists():
        raise InputError(
            "dataset_path does not exist", where=str(resolve_user_path(dataset)), hint="check the path on this node"
        )
