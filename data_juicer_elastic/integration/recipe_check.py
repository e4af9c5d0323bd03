"""Refuse recipes that cannot be run shard by shard (README.md, "What a recipe may contain"): each
shard runs the recipe on a contiguous slice of the input, so only per-sample Mappers and Filters
are safe, and a ``stats_export_path`` would be written by every shard at once.  And an elastic job's
input is a local file or folder that exists (:func:`check_dataset_path`).
"""

from __future__ import annotations

import os
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.compat import dj_config_internals
from data_juicer_elastic.errors import ConfigError, InputError, RecipeError
from data_juicer_elastic.integration.config_block import cfg_value
from data_juicer_elastic.integration.recipe import op_entries
from data_juicer_elastic.jobdir.layout import resolve_user_path

SHARD_SAFE: Final = ("Mapper", "Filter")
REFUSED_KINDS: Final = ("Deduplicator", "Selector", "Grouper", "Aggregator", "Pipeline")
_WHY = {
    "Deduplicator": "deduplication compares rows across the whole dataset, so each shard would deduplicate only itself",
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
        if kind not in SHARD_SAFE:
            why = _WHY.get(kind, "only Mapper and Filter operators are per-sample")
            raise RecipeError(f"{kind or 'this operator type'} is not shard-safe: {why}", where=where, hint=_WHAT_TO_DO)
        args = args or {}
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
