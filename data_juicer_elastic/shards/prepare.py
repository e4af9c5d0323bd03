"""Prepare a job: check the request, plan its shards (``shards.plan``) and publish ``recipe.json`` and, last,
``plan.json`` with ``link()`` (first wins: its presence means "planned").  Preparing again with the same request
is a no-op; with a different one, an error naming what changed.  The data is read by the scans
(docs/input-format.md); :func:`prepare_job` also scans every shard here (``dj-elastic prepare --scan``).
"""

from __future__ import annotations

import hashlib
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from data_juicer_elastic.errors import (
    ConfigError,
    InputChangedError,
    InputError,
    JobDirError,
    RequestChanged,
    storage_errors,
)
from data_juicer_elastic.jobdir.layout import MAX_SHARDS, JobLayout, check_ours, ensure_dir, make_job_dir
from data_juicer_elastic.jobdir.manifest import load_manifest, load_plan, manifest_recipe_hash
from data_juicer_elastic.jobdir.records import JobPlan, Manifest, PlannedInput, canonical_json
from data_juicer_elastic.jobdir.retry import recipe_differences
from data_juicer_elastic.jobdir.worker import scan_job
from data_juicer_elastic.rows.codecs import CODECS, Codec
from data_juicer_elastic.rows.jsonl import DEFAULT_MEDIA_KEYS
from data_juicer_elastic.settings import (
    DEFAULT_LEASE_TTL_SECS,
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_RETRIES,
    DEFAULT_POLL_INTERVAL_SECS,
    InputOrder,
)
from data_juicer_elastic.shards.plan import InputItem, discover_inputs, plan_shards
from data_juicer_elastic.shards.scan import ShardScanner
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity


@dataclass(frozen=True)
class PrepareRequest:
    job_dir: str | Path
    dataset_path: str | Path
    num_shards: int
    recipe: dict[str, Any]
    stage_identities: list[str]
    media_keys: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_MEDIA_KEYS))
    index_key: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    ray: dict[str, Any] = field(default_factory=dict)
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    shard_codec: Codec = "none"  # how copied shard files are stored (copy_shards)
    copy_shards: bool = False  # scans copy each shard into the job dir (else shards are byte ranges of the inputs)
    input_order: InputOrder = "sorted"  # directory inputs: by relative path, or as Data-Juicer's default executor
    code: dict[str, Any] | None = None  # fingerprint of the operator code (execution.code_fingerprint)
    export_path: str | None = None  # the recipe's, absolute (JobPlan.export_path: merge's default output)

    def __post_init__(self) -> None:
        if self.shard_codec != "none" and not self.copy_shards:  # a codec is how copies are stored: it asks for them
            object.__setattr__(self, "copy_shards", True)


@dataclass(frozen=True)
class PlanOutcome:
    plan: JobPlan
    created: bool


@dataclass(frozen=True)
class PrepareOutcome:
    manifest: Manifest
    created: bool


# ENOSPC, EIO...: one line naming the path, exit 2; a failed prepare leaves nothing that looks prepared
@storage_errors(then="prepare again")
def plan_job(request: PrepareRequest, *, complete: Callable[[], PrepareRequest] | None = None) -> PlanOutcome:
    """Plan ``request.job_dir`` (idempotent for an identical request) and publish the plan.

    ``complete``: ``request`` is an early one whose input fields (:func:`input_fields`) are known but whose recipe
    may not be yet (parsing it imports Data-Juicer, seconds): planning starts at once, and ``complete()`` gives
    the whole request before anything is published or compared.  RequestChanged (nothing published) when its input
    fields differ; the caller plans again with it.
    """
    dataset, kind = _check_request(request)
    inputs = discover_inputs(dataset, request.input_order)
    layout = JobLayout(Path(os.path.abspath(request.job_dir)))

    make_job_dir(layout)  # a file in its place is refused here, not met as a traceback
    if fsio.exists(layout.plan):
        request = _completed(request, complete)
        rhash = manifest_recipe_hash(request.recipe)
        return PlanOutcome(_check_existing(layout, request, dataset, rhash, inputs), created=False)
    check_ours(layout)  # never litter a directory that is not a job (or planted links)
    stats = [fsio.stat(item.path) for item in inputs]
    shards, bytes_read = plan_shards(inputs, [st.st_size for st in stats], request.num_shards, request.max_line_bytes)
    request = _completed(request, complete)
    rhash = manifest_recipe_hash(request.recipe)
    planned = [
        PlannedInput(str(item.path), item.relpath, item.codec, st.st_size, st.st_mtime_ns)
        for item, st in zip(inputs, stats, strict=True)
    ]
    for directory in (layout.cache_dir, layout.claims_dir, layout.done_dir, layout.attempts_dir):
        ensure_dir(layout, directory)
    if not fsio.publish_bytes(layout.recipe, canonical_json(request.recipe)):
        raise JobDirError(
            "job_dir holds the recipe of a different job",
            where=str(layout.recipe),
            hint="use a new job_dir for a different recipe",
        )
    plan = JobPlan(
        job_id=uuid.uuid4().hex,
        created_at=time.time(),
        dataset_path=str(dataset),
        dataset_kind=kind,
        inputs=planned,
        num_shards=request.num_shards,
        recipe_hash=rhash,
        recipe=request.recipe,
        stage_identities=list(request.stage_identities),
        media_keys=_media_keys(request),
        index_key=request.index_key,
        versions=dict(request.versions),
        ray=dict(request.ray),
        settings=dict(request.settings),
        shards=shards,
        request_fingerprint=_fingerprint(request, dataset, rhash, planned),
        max_line_bytes=request.max_line_bytes,
        shard_codec=request.shard_codec,
        copy_shards=request.copy_shards,
        code=request.code,
        planned_bytes_read=bytes_read,
        export_path=request.export_path,
    )
    # Published last, exclusively: its presence is what "planned" means.
    if fsio.publish_bytes(layout.plan, plan.encode()):
        logger.info(
            f"planned {layout.root}: {request.num_shards} shards over {len(inputs)} file(s), "
            f"{plan.total_bytes} bytes ({bytes_read} read to place the cuts)"
        )
        return PlanOutcome(load_plan(layout.root), created=True)
    # A concurrent preparer won; fine if it planned the same thing.
    return PlanOutcome(_check_existing(layout, request, dataset, rhash, inputs), created=False)


def prepare_job(
    request: PrepareRequest,
    *,
    complete: Callable[[], PrepareRequest] | None = None,
    identity: WorkerIdentity | None = None,
) -> PrepareOutcome:
    """Plan the job and scan every shard on this node: the job's manifest (idempotent)."""
    outcome = plan_job(request, complete=complete)
    layout = JobLayout(Path(os.path.abspath(request.job_dir)))
    if fsio.exists(layout.manifest):
        return PrepareOutcome(load_manifest(layout.root), created=outcome.created)
    settings = request.settings
    ttl = float(settings.get("lease_ttl_secs") or DEFAULT_LEASE_TTL_SECS)
    with storage_errors(then="prepare again"):
        manifest = scan_job(
            layout,
            identity or WorkerIdentity.current(),
            ShardScanner(total_bytes=outcome.plan.total_bytes),
            ttl_secs=ttl,
            heartbeat_secs=float(settings.get("heartbeat_interval_secs") or ttl / 4),
            max_retries=int(settings.get("max_retries", DEFAULT_MAX_RETRIES)),
            poll_interval_secs=float(settings.get("poll_interval_secs") or DEFAULT_POLL_INTERVAL_SECS),
            rng=random.Random(0),
        )
    assert manifest is not None
    return PrepareOutcome(manifest, created=outcome.created)


def input_fields(request: PrepareRequest) -> tuple:
    """What the plan depends on: equal for two requests, the same shards come out."""
    return (
        os.path.abspath(request.job_dir),
        os.path.abspath(request.dataset_path),
        request.num_shards,
        _media_keys(request),
        request.index_key,
        request.max_line_bytes,
        request.shard_codec,
        request.copy_shards,
        request.input_order,
    )


def _completed(request: PrepareRequest, complete: Callable[[], PrepareRequest] | None) -> PrepareRequest:
    if complete is None:
        return request
    whole = complete()
    if input_fields(whole) != input_fields(request):
        raise RequestChanged()
    _check_request(whole)
    return whole


def _check_request(request: PrepareRequest) -> tuple[Path, str]:
    n = request.num_shards
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SHARDS:
        raise ConfigError(f"num_shards must be an integer from 1 to {MAX_SHARDS}, got {n!r}", where="num_shards")
    if not isinstance(request.media_keys, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in request.media_keys.items()
    ):
        raise ConfigError("media_keys must map names to row keys (strings or null)", where="media_keys")
    if not isinstance(request.stage_identities, list) or not all(isinstance(s, str) for s in request.stage_identities):
        raise ConfigError("stage_identities must be a list of strings", where="stage_identities")
    if not isinstance(request.recipe, dict):
        raise ConfigError("the shard recipe must be a dict", where="recipe")
    if request.shard_codec not in CODECS:
        raise ConfigError(
            f"unknown shard codec {request.shard_codec!r}", where="shard_codec", hint=f"use one of {', '.join(CODECS)}"
        )
    dataset = Path(os.path.abspath(request.dataset_path))
    if dataset.is_file():
        kind = "file"
    elif dataset.is_dir():
        kind = "directory"
        job = Path(os.path.abspath(request.job_dir))
        if job == dataset or dataset in job.parents:
            raise ConfigError(
                "job_dir is inside the dataset directory, so shards would become input",
                where=str(job),
                hint="put job_dir outside the dataset directory",
            )
    else:
        raise InputError("dataset_path does not exist", where=str(dataset), hint="check the path on this node")
    return dataset, kind


def _media_keys(request: PrepareRequest) -> dict[str, str]:
    """The media keys in effect (a key set to null or "" in the recipe normalises nothing)."""
    return {name: key for name, key in request.media_keys.items() if key}


def _fingerprint(request: PrepareRequest, dataset: Path, rhash: str, inputs: list[PlannedInput]) -> str:
    identity = {
        "dataset_path": str(dataset),
        "num_shards": request.num_shards,
        "recipe_hash": rhash,
        "stage_identities": list(request.stage_identities),
        "media_keys": _media_keys(request),
        "index_key": request.index_key,
        "inputs": [[f.relpath, f.size, f.mtime_ns] for f in inputs],
        "copy_shards": request.copy_shards,
    }
    if request.shard_codec != "none":
        identity["shard_codec"] = request.shard_codec
    if request.input_order != "sorted":
        identity["input_order"] = request.input_order
    return hashlib.sha256(canonical_json(identity)).hexdigest()


def _check_existing(
    layout: JobLayout, request: PrepareRequest, dataset: Path, rhash: str, inputs: list[InputItem]
) -> JobPlan:
    plan = load_plan(layout.root)
    compared = (
        ("dataset_path", plan.dataset_path, str(dataset)),
        ("num_shards", plan.num_shards, request.num_shards),
        ("media_keys", plan.media_keys, _media_keys(request)),
        ("index_key", plan.index_key, request.index_key),
        ("shard_codec", plan.shard_codec, request.shard_codec),
        ("copy_shards", plan.copy_shards, request.copy_shards),
    )
    differences = [f"{name} was {old!r}, now {new!r}" for name, old, new in compared if old != new]
    differences += recipe_differences(plan, request.recipe, rhash, request.stage_identities, request.versions)
    old_order, new_order = [f.relpath for f in plan.inputs], [i.relpath for i in inputs]
    if old_order != new_order and sorted(old_order) == sorted(new_order):
        differences.append(f"the input files' order (elastic.input_order) differs, now {request.input_order!r}")
    if differences:
        raise JobDirError(
            "job_dir already holds a different job: " + "; ".join(differences),
            where=str(layout.root),
            hint="use a new job_dir for a different input, recipe or shard count",
        )
    old_files = {f.relpath: f for f in plan.inputs}
    new_files = {i.relpath: i for i in inputs}
    if set(old_files) != set(new_files):
        added, removed = sorted(set(new_files) - set(old_files)), sorted(set(old_files) - set(new_files))
        raise InputChangedError(
            f"input files changed since prepare (added: {added[:5]}, removed: {removed[:5]})",
            where=str(dataset),
            hint="a changed input needs a new job_dir",
        )
    for relpath, old in old_files.items():
        now = fsio.stat(new_files[relpath].path)
        if (now.st_size, now.st_mtime_ns) != (old.size, old.mtime_ns):
            raise InputChangedError(
                f"input changed since prepare: size {old.size} -> {now.st_size}, "
                f"mtime_ns {old.mtime_ns} -> {now.st_mtime_ns}",
                where=str(new_files[relpath].path),
                hint="a changed input needs a new job_dir",
            )
    return plan
