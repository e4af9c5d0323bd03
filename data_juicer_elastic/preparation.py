"""Prepare a job from a parsed Data-Juicer cfg: the shard recipe, its checks, the request, the split.
Apart from ``executor`` (whose import pulls in Data-Juicer's core and Ray): ``dj-elastic prepare``
needs only the recipe parse.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from data_juicer_elastic import __version__
from data_juicer_elastic.console import StepDisplay, say
from data_juicer_elastic.console.summary import run_clock_start, shown_path
from data_juicer_elastic.errors import ElasticError, PrepareCancelled
from data_juicer_elastic.execution.code_fingerprint import code_fingerprint
from data_juicer_elastic.execution.stage_identities import compute_stage_identities
from data_juicer_elastic.integration.config_block import cfg_value
from data_juicer_elastic.integration.recipe import (
    build_shard_recipe,
    check_dataset_path,
    check_shard_safe,
    index_key,
    media_keys,
)
from data_juicer_elastic.jobdir.exports import export_target
from data_juicer_elastic.jobdir.layout import JobLayout, resolve_user_path
from data_juicer_elastic.report.svg import fmt_bytes
from data_juicer_elastic.settings import ElasticSettings
from data_juicer_elastic.shards import steps
from data_juicer_elastic.shards.prepare import (
    PlanOutcome,
    PrepareOutcome,
    PrepareRequest,
    RequestChanged,
    plan_job,
    prepare_job,
)


def prepare_request(cfg: Any, settings: ElasticSettings) -> PrepareRequest:
    """The shard recipe (checked) and everything prepare records, from a parsed cfg."""
    check_dataset_path(cfg)
    recipe = build_shard_recipe(cfg)
    check_shard_safe(recipe)
    import data_juicer

    return _request(
        settings,
        cfg.dataset_path,
        cfg,
        recipe=recipe,
        stage_identities=compute_stage_identities(recipe),
        settings=dataclasses.asdict(settings),
        versions={"data_juicer": data_juicer.__version__, "data_juicer_elastic": __version__},
        ray={"address": settings.ray_address, "num_cpus": settings.ray_num_cpus},
        code=code_fingerprint(recipe),
    )


def _request(elastic: ElasticSettings, dataset_path: Any, source: Any, /, **fields: Any) -> PrepareRequest:
    """A request's input fields from the ``elastic`` settings and the recipe (a parsed cfg, or its YAML)."""
    export = cfg_value(source, "export_path", None)
    return PrepareRequest(
        job_dir=resolve_user_path(elastic.job_dir),
        dataset_path=resolve_user_path(dataset_path),
        num_shards=elastic.num_shards,
        media_keys=media_keys(source),
        index_key=index_key(source),
        max_line_bytes=elastic.max_line_bytes,
        shard_codec=elastic.shard_codec,
        copy_shards=elastic.copy_shards,
        input_order=elastic.input_order,
        export_path=str(export_target(export)) if isinstance(export, str) and export else None,
        **fields,
    )


def prepare_from_cfg(cfg: Any, settings: ElasticSettings) -> PlanOutcome:
    """Validate the recipe, plan the job and publish the plan (a no-op when identical)."""
    return _prepare(prepare_request(cfg, settings))


def _prepare(
    request: PrepareRequest, complete=None, cancel: threading.Event | None = None, scan: bool = False
) -> PlanOutcome | PrepareOutcome:
    def report(step: str, done: int, total: int | None) -> None:
        if cancel is not None and cancel.is_set():
            raise PrepareCancelled()  # the recipe was refused while the input pass ran: stop it
        display(step, done, total)

    # a live line on a terminal, else log lines; its elapsed time is the run's (console.summary.run_clock_start)
    with StepDisplay(started=run_clock_start(request.job_dir)) as display, steps.reporting(report):
        outcome = (prepare_job if scan else plan_job)(request, complete=complete)
    if scan:
        manifest = outcome.manifest
        verb = "prepared" if outcome.created else "reusing the prepared job"
        say(f"{verb} {shown_path(request.job_dir)}: {manifest.total_rows:,} rows in {len(manifest.shards)} shards")
    else:
        plan = outcome.plan
        verb = "planned" if outcome.created else "reusing the planned job"
        scanned = not outcome.created and JobLayout(Path(request.job_dir)).manifest.exists()  # a hint for a line
        say(
            f"{verb} {shown_path(request.job_dir)}: {len(plan.shards)} shards over {len(plan.inputs):,} file(s), "
            f"{fmt_bytes(plan.total_bytes)} ({'scanned before' if scanned else 'the workers scan the data'})"
        )
    return outcome


def prepare_overlapped(
    early: PrepareRequest | None, parse: Callable[[], PrepareRequest], scan: bool = False
) -> PlanOutcome | PrepareOutcome:
    """``dj-elastic prepare``: the input pass starts at once on a thread from ``early`` (the YAML read
    without Data-Juicer) while ``parse`` (Data-Juicer's import and parse: seconds) runs here.  The
    pass publishes nothing before the parsed request is there; if ``early`` guessed an input field
    wrong, the job is prepared again; if the parse refuses the recipe, the pass stops at its next
    progress report and the refusal is raised."""
    if early is None:
        return _prepare(parse(), scan=scan)
    parsed: dict[str, Any] = {}
    ready, cancel = threading.Event(), threading.Event()

    def complete() -> PrepareRequest:
        ready.wait()
        if "error" in parsed:
            raise PrepareCancelled()
        return parsed["request"]

    def run() -> None:
        try:
            parsed["outcome"] = _prepare(early, complete, cancel, scan=scan)
        except BaseException as exc:  # handed to the caller's thread
            parsed["failed"] = exc

    worker = threading.Thread(target=run, name="dj-elastic-prepare", daemon=True)
    worker.start()
    try:
        parsed["request"] = parse()
    except BaseException as exc:
        parsed["error"] = exc
        cancel.set()
        raise
    finally:
        ready.set()
        worker.join()
    failed = parsed.get("failed")
    if isinstance(failed, RequestChanged):
        return _prepare(parsed["request"], scan=scan)  # the early read of the YAML was not what Data-Juicer parsed
    if failed is not None:
        raise failed
    return parsed["outcome"]


def early_request(config: str, overrides: dict[str, Any]) -> PrepareRequest | None:
    """The input fields of a recipe read as plain YAML (no Data-Juicer), or None when that read
    cannot tell (the parse then says what is wrong); only a guess, checked by ``prepare_overlapped``.
    ``overrides``: the command line's ``dataset_path`` and ``elastic.*``.  Any other error is a bug
    and is raised."""
    import yaml

    if any(key.startswith("DJ_PROCESS_") for key in os.environ):
        return None  # Data-Juicer's parser reads those too
    try:
        with open(config, encoding="utf-8") as handle:
            recipe = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # not a file, or not YAML this reader takes (Data-Juicer's parser may)
    if not _plain_recipe(recipe):
        return None  # not an elastic recipe, or not shaped as one: the parse refuses it or says what it is
    block = dict(recipe.get("elastic") or {})
    block.update({k: v for k, v in overrides.items() if k != "dataset_path" and v is not None})
    dataset = overrides.get("dataset_path") or recipe.get("dataset_path")
    if not isinstance(dataset, str):
        return None
    try:
        return _request(ElasticSettings.from_mapping(block), dataset, recipe, recipe={}, stage_identities=[])
    except ElasticError:  # a bad setting or operator entry: the parse reports it with Data-Juicer's own checks first
        return None


def _plain_recipe(recipe: Any) -> bool:
    """An ``elastic_sharded`` recipe whose ``elastic`` block and ``process`` entries are mappings."""
    if not isinstance(recipe, dict) or recipe.get("executor_type") != "elastic_sharded":
        return False
    block, process = recipe.get("elastic") or {}, recipe.get("process") or []
    return (
        isinstance(block, dict)
        and all(isinstance(key, str) for key in block)
        and isinstance(process, list)
        and all(
            isinstance(entry, dict) and all(isinstance(a, dict) or not a for a in entry.values()) for entry in process
        )
    )
