"""Prepare a job: validate and split the input into shards, publish the manifest last.

The input is read once (``ingest``): every row validated and normalised, every
input file fingerprinted (sha256 of its stored bytes, size, mtime_ns, rows), and
exactly ``num_shards`` non-empty contiguous shards balanced by normalised bytes
written into a private staging directory (a second, parse-free pass over the
staged bytes only when the first pass could not cut the final shards itself).
Memory stays bounded by one line plus a few read blocks.

Then the staged ``shards/`` directory is renamed into place (a rename onto a
non-empty directory fails, so concurrent preparers cannot interleave shards),
``recipe.json`` and finally ``manifest.json`` are published with ``link()``.
The manifest's presence means "prepared"; preparing again with the same request
is a no-op, with a different request an error.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
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
from data_juicer_elastic.jobdir import confine
from data_juicer_elastic.jobdir.layout import MAX_SHARDS, JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.recipe_diff import recipe_differences
from data_juicer_elastic.jobdir.records import (
    InputFile,
    Manifest,
    ShardEntry,
    canonical_json,
    manifest_recipe_hash,
)
from data_juicer_elastic.rows.codecs import CODECS, SHARD_SUFFIX, Codec, input_codec
from data_juicer_elastic.rows.jsonl import DEFAULT_MEDIA_KEYS, NormaliseOptions
from data_juicer_elastic.settings import DEFAULT_MAX_LINE_BYTES, InputOrder
from data_juicer_elastic.shards.ingest import InputItem, ingest
from data_juicer_elastic.sharedfs import fsio


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
    shard_codec: Codec = "none"  # how shard files are stored
    check_processes: int | None = None  # row-checking helper processes; None: by input size and cores
    input_order: InputOrder = "sorted"  # directory inputs: by relative path, or as Data-Juicer's default executor
    code: dict[str, Any] | None = None  # fingerprint of the operator code (execution.code_fingerprint)


@dataclass(frozen=True)
class PrepareOutcome:
    manifest: Manifest
    created: bool


# ENOSPC, EIO...: one line naming the path, exit 2; a failed prepare leaves nothing that looks prepared
@storage_errors(then="prepare again")
def prepare_job(request: PrepareRequest, *, complete: Callable[[], PrepareRequest] | None = None) -> PrepareOutcome:
    """Prepare ``request.job_dir`` (idempotent for an identical request).

    ``complete``: ``request`` is an early one whose input fields (:func:`input_fields`) are
    known but whose recipe may not be yet (parsing it imports Data-Juicer, seconds): the input
    pass starts at once, and ``complete()`` is called for the whole request before anything
    is published or an existing job is compared.  RequestChanged (nothing published) when its
    input fields differ; the caller prepares again with it.
    """
    dataset, kind = _check_request(request)
    inputs = discover_inputs(dataset, request.input_order)
    layout = JobLayout(Path(os.path.abspath(request.job_dir)))

    confine.make_job_dir(layout)  # a file in its place is refused here, not met as a traceback
    if fsio.exists(layout.manifest):
        request = _completed(request, complete)
        rhash = manifest_recipe_hash(request.recipe)
        return PrepareOutcome(_check_existing(layout, request, dataset, rhash, inputs), created=False)

    options = NormaliseOptions(
        base_dir=str(dataset.parent if kind == "file" else dataset),
        media_keys=_media_keys(request),
        index_key=request.index_key,
        max_line_bytes=request.max_line_bytes,
    )
    confine.check_ours(layout)  # never litter a directory that is not a job (or planted links)
    token = f"{int(time.time())}-{os.getpid()}-{secrets.token_hex(4)}"
    staging = layout.staging_dir(token)
    confine.ensure_dir(layout, staging / "shards")
    try:
        ingested = ingest(
            inputs,
            options,
            staging,
            staging / "shards",
            request.num_shards,
            request.shard_codec,
            request.check_processes,
        )
        if ingested is None:
            raise InputError(
                "the input holds no rows", where=str(dataset), hint="point dataset_path at non-empty JSONL"
            )
        total_rows, total_bytes, fingerprints = ingested.total_rows, ingested.total_bytes, ingested.inputs
        if request.num_shards > total_rows:
            raise ConfigError(
                f"num_shards={request.num_shards} is more than the {total_rows} input rows",
                where="num_shards",
                hint=f"use at most {total_rows} shards",
            )
        request = _completed(request, complete)
        rhash = manifest_recipe_hash(request.recipe)
        shards, content_sha = ingested.shards, ingested.content_sha256
        _publish_shards(layout, staging / "shards", shards, request.shard_codec)
        for directory in (layout.cache_dir, layout.claims_dir, layout.done_dir, layout.attempts_dir):
            confine.ensure_dir(layout, directory)
        _publish_recipe(layout, staging, request.recipe)
        manifest = Manifest(
            job_id=uuid.uuid4().hex,
            created_at=time.time(),
            dataset_path=str(dataset),
            dataset_kind=kind,
            inputs=fingerprints,
            num_shards=request.num_shards,
            total_rows=total_rows,
            total_bytes=total_bytes,
            content_sha256=content_sha,
            recipe_hash=rhash,
            recipe=request.recipe,
            stage_identities=list(request.stage_identities),
            media_keys=_media_keys(request),
            index_key=request.index_key,
            versions=dict(request.versions),
            ray=dict(request.ray),
            settings=dict(request.settings),
            shards=shards,
            request_fingerprint=_fingerprint(request, dataset, rhash, fingerprints),
            shard_codec=request.shard_codec,
            row_schema=ingested.schema.to_json(),
            code=request.code,
        )
        staged_manifest = staging / "manifest.json"
        fsio.write_new(staged_manifest, manifest.encode())
        # Published last, exclusively: its presence is what "prepared" means.
        if fsio.publish_exclusive(staged_manifest, layout.manifest):
            logger.info(
                f"prepared {layout.root}: {total_rows} rows in {request.num_shards} shards "
                f"({ingested.passes} pass{'es' if ingested.passes > 1 else ''})"
            )
            return PrepareOutcome(manifest, created=True)
        # A concurrent preparer won; fine if it prepared the same thing.
        return PrepareOutcome(_check_existing(layout, request, dataset, rhash, inputs), created=False)
    finally:
        fsio.remove_tree(staging)


# -- request and inputs ----------------------------------------------------------------------
def input_fields(request: PrepareRequest) -> tuple:
    """What the input pass depends on: equal for two requests, the same shards come out."""
    return (
        os.path.abspath(request.job_dir),
        os.path.abspath(request.dataset_path),
        request.num_shards,
        _media_keys(request),
        request.index_key,
        request.max_line_bytes,
        request.shard_codec,
        request.check_processes,
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


def discover_inputs(dataset: Path, order: InputOrder = "sorted") -> list[InputItem]:
    """One file, or every ``*.jsonl``/``*.jsonl.gz``/``*.jsonl.zst`` below a directory, sorted by
    relative POSIX path (``order="sorted"``: the same order on every filesystem), or in the
    order Data-Juicer's default executor reads them (``"data_juicer"``, :func:`data_juicer_order`)."""
    if dataset.is_file():
        # A single file is JSONL whatever its name; only a .gz/.zst ending chooses a decoder.
        codec = input_codec(dataset.name) or {".gz": "gzip", ".zst": "zstd"}.get(dataset.suffix, "none")
        return [InputItem(dataset, dataset.name, codec)]
    found: list[InputItem] = []
    # os.walk without following directory symlinks: the order and the set of files
    # must not depend on link loops; linked *files* are read like any file.
    for root, dirs, files in os.walk(dataset):
        dirs.sort()
        for name in files:
            codec = input_codec(name)
            if codec is not None:
                path = Path(root) / name
                found.append(InputItem(path, path.relative_to(dataset).as_posix(), codec))
    found.sort(key=lambda item: item.relpath)
    if order == "data_juicer":
        found = data_juicer_order(dataset, found)
    elif order != "sorted":
        raise ConfigError(f"unknown input order {order!r}", where="input_order", hint="use sorted or data_juicer")
    if not found:
        raise InputError(
            "no *.jsonl, *.jsonl.gz or *.jsonl.zst files found",
            where=str(dataset),
            hint="directory inputs are searched recursively",
        )
    return found


def data_juicer_order(dataset: Path, found: list[InputItem]) -> list[InputItem]:
    """``found`` in the order of Data-Juicer 1.6.1's default executor: its loader lists the
    directory with ``Path.rglob("*")`` (the filesystem's own order), groups the files by
    suffix (``.jsonl``, ``.jsonl.gz``, ...; groups in order of their first file) and reads
    group after group (``utils/file_utils.find_files_with_suffix``, ``format/formatter.py``).
    That order can differ between filesystems and copies of the same files."""
    by_path = {item.path: item for item in found}
    groups: dict[str, list[InputItem]] = {}
    for path in dataset.rglob("*"):
        item = by_path.get(path)
        if item is not None:
            key = "".join(s.lower() for s in path.suffixes[-2:]) if item.codec != "none" else path.suffix.lower()
            groups.setdefault(key, []).append(item)
    return [item for group in groups.values() for item in group]


# -- publication ------------------------------------------------------------------------------
def _publish_shards(layout: JobLayout, staged: Path, shards: list[ShardEntry], codec: str) -> None:
    try:
        fsio.move(staged, layout.shards_dir)
        return
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
    # Another preparer (or a crashed earlier run) already placed shards: they must be ours, byte for byte.
    expected = {f"{e.shard_id}{SHARD_SUFFIX[codec]}": e for e in shards}
    present = {n for n in fsio.list_names(layout.shards_dir) if not n.startswith(".")}
    mismatch = sorted(present ^ set(expected))
    for name, entry in expected.items():
        if name in present and fsio.file_sha256(layout.shards_dir / name) != entry.stored():
            mismatch.append(name)
    if mismatch:
        raise JobDirError(
            f"job_dir holds shards from a different, unfinished prepare (differs: {', '.join(mismatch[:5])})",
            where=str(layout.shards_dir),
            hint="use a new job_dir, or delete this one if no worker uses it",
        )


def _publish_recipe(layout: JobLayout, staging: Path, recipe: dict[str, Any]) -> None:
    data = canonical_json(recipe)
    staged = staging / "recipe.json"
    fsio.write_new(staged, data)
    if not fsio.publish_exclusive(staged, layout.recipe):
        raise JobDirError(
            "job_dir holds the recipe of a different job",
            where=str(layout.recipe),
            hint="use a new job_dir for a different recipe",
        )


# -- idempotency --------------------------------------------------------------------------------
def _fingerprint(request: PrepareRequest, dataset: Path, rhash: str, inputs: list[InputFile]) -> str:
    identity = {
        "dataset_path": str(dataset),
        "num_shards": request.num_shards,
        "recipe_hash": rhash,
        "stage_identities": list(request.stage_identities),
        "media_keys": _media_keys(request),
        "index_key": request.index_key,
        "inputs": [[f.relpath, f.size, f.mtime_ns] for f in inputs],
    }
    if request.shard_codec != "none":  # absent otherwise, so fingerprints of older jobs stay the same
        identity["shard_codec"] = request.shard_codec
    if request.input_order != "sorted":
        identity["input_order"] = request.input_order
    return hashlib.sha256(canonical_json(identity)).hexdigest()


def _check_existing(
    layout: JobLayout, request: PrepareRequest, dataset: Path, rhash: str, inputs: list[InputItem]
) -> Manifest:
    manifest = load_manifest(layout.root)
    differences = []
    for name, old, new in (
        ("dataset_path", manifest.dataset_path, str(dataset)),
        ("num_shards", manifest.num_shards, request.num_shards),
        ("media_keys", manifest.media_keys, _media_keys(request)),
        ("index_key", manifest.index_key, request.index_key),
        ("shard_codec", manifest.shard_codec, request.shard_codec),
    ):
        if old != new:
            differences.append(f"{name} was {old!r}, now {new!r}")
    differences += recipe_differences(manifest, request.recipe, rhash, request.stage_identities, request.versions)
    old_order, new_order = [f.relpath for f in manifest.inputs], [i.relpath for i in inputs]
    if old_order != new_order and sorted(old_order) == sorted(new_order):
        differences.append(f"the input files' order (elastic.input_order) differs, now {request.input_order!r}")
    if differences:
        raise JobDirError(
            "job_dir already holds a different job: " + "; ".join(differences),
            where=str(layout.root),
            hint="use a new job_dir for a different input, recipe or shard count",
        )
    old_files = {f.relpath: f for f in manifest.inputs}
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
            new_sha = fsio.file_sha256(new_files[relpath].path)[1]
            raise InputChangedError(
                f"input changed since prepare: sha256 {old.sha256} -> {new_sha} "
                f"(size {old.size} -> {now.st_size}, mtime_ns {old.mtime_ns} -> {now.st_mtime_ns})",
                where=str(new_files[relpath].path),
                hint="a changed input needs a new job_dir",
            )
    return manifest
