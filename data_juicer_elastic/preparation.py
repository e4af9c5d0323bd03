"""Prepare a job from a parsed Data-Juicer cfg: the shard recipe, its checks, the request, the split.

Its own module, apart from ``executor`` (which subclasses Data-Juicer's executor base,
whose import pulls in Data-Juicer's core and Ray): ``dj-elastic prepare`` needs only the
recipe parse.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from loguru import logger

from data_juicer_elastic import __version__
from data_juicer_elastic.console import StepDisplay, say
from data_juicer_elastic.console.summary import shown_path
from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.jobdir import steps
from data_juicer_elastic.jobdir.prepare import PrepareOutcome, PrepareRequest, prepare_job
from data_juicer_elastic.jobdir.row_schema import RowSchema, operator_view_notes
from data_juicer_elastic.settings import ElasticSettings


def _resolve(path: str | os.PathLike) -> Path:
    return Path(path).expanduser().resolve()


def prepare_request(cfg: Any, settings: ElasticSettings) -> PrepareRequest:
    """The shard recipe (checked) and everything prepare records, from a parsed cfg."""
    from data_juicer_elastic.execution.stage_identities import compute_stage_identities
    from data_juicer_elastic.integration.recipe import build_shard_recipe, index_key, media_keys
    from data_juicer_elastic.integration.recipe_check import check_shard_safe

    if not getattr(cfg, "dataset_path", None):
        raise ConfigError("dataset_path is not set", where="recipe", hint="set dataset_path to a .jsonl file or folder")
    recipe = build_shard_recipe(cfg)
    check_shard_safe(recipe)
    import data_juicer

    return PrepareRequest(
        job_dir=_resolve(settings.job_dir),
        dataset_path=_resolve(cfg.dataset_path),
        num_shards=settings.num_shards,
        recipe=recipe,
        stage_identities=compute_stage_identities(recipe),
        media_keys=media_keys(cfg),
        index_key=index_key(cfg),
        settings=settings.to_dict(),
        versions={"data_juicer": data_juicer.__version__, "data_juicer_elastic": __version__},
        ray={"address": settings.ray_address, "num_cpus": settings.ray_num_cpus},
        max_line_bytes=settings.max_line_bytes,
        shard_codec=settings.shard_codec,
        input_order=settings.input_order,
    )


def prepare_from_cfg(cfg: Any, settings: ElasticSettings) -> PrepareOutcome:
    """Validate the recipe and input, and publish the job directory (a no-op when identical)."""
    request = prepare_request(cfg, settings)
    with StepDisplay() as display, steps.reporting(display):  # a live line on a terminal, else log lines
        outcome = prepare_job(request)
    manifest = outcome.manifest
    verb = "prepared" if outcome.created else "reusing the prepared job"
    say(f"{verb} {shown_path(request.job_dir)}: {manifest.total_rows:,} rows in {len(manifest.shards)} shards")
    if manifest.row_schema is not None:
        for note in operator_view_notes(RowSchema.from_json(manifest.row_schema)):
            logger.warning(f"{note} (the output keeps every untouched value as it was; see docs/lossless.md)")
    return outcome
