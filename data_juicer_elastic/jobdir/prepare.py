"""Prepare a job: validate and split the input into shards, publish the manifest last.

Two streaming passes (memory stays bounded by one line):

1. validate every row, fingerprint every input file (sha256, size, mtime_ns,
   rows) and total the normalised bytes;
2. normalise again and write exactly ``num_shards`` non-empty contiguous shards
   balanced by normalised bytes into a private staging directory, re-hashing
   the inputs: any difference from pass 1 is an InputChangedError.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.errors import ConfigError, InputChangedError, InputError, JobDirError
from data_juicer_elastic.jobdir import confine, fsio, steps
from data_juicer_elastic.jobdir.jsonl import MAX_LINE_BYTES, FileScan, NormaliseOptions, iter_normalised
from data_juicer_elastic.jobdir.layout import MAX_SHARDS, JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import (
    InputFile,
    Manifest,
    ShardEntry,
    canonical_json,
    recipe_hash,
)
from data_juicer_elastic.jobdir.splitter import ShardSplitter

_REPORT_EVERY: Final = 0x3FFF  # progress report (jobdir.steps) every 16,384 rows, never per row
DEFAULT_MEDIA_KEYS: Final = {"image_key": "images", "audio_key": "audios", "video_key": "videos"}


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
    max_line_bytes: int = MAX_LINE_BYTES


@dataclass(frozen=True)
class PrepareOutcome:
    manifest: Manifest
    created: bool


@dataclass(frozen=True)
class _Input:
    path: Path  # absolute
    relpath: str  # POSIX, relative to the dataset root (file name for one file)


def prepare_job(request: PrepareRequest) -> PrepareOutcome:
    """Prepare ``request.job_dir`` (idempotent for an identical request)."""
    dataset, kind = _check_request(request)
    inputs = discover_inputs(dataset)
    layout = JobLayout(Path(os.path.abspath(request.job_dir)))
    rhash = recipe_hash(request.recipe)

    if fsio.exists(layout.manifest):
        return PrepareOutcome(_check_existing(layout, request, dataset, rhash, inputs), created=False)

    options = NormaliseOptions(
        base_dir=str(dataset.parent if kind == "file" else dataset),
        media_keys=_media_keys(request),
        index_key=request.index_key,
        max_line_bytes=request.max_line_bytes,
    )
    fingerprints, total_bytes = _pass_one(inputs, options)
    total_rows = sum(f.rows for f in fingerprints)
    if total_rows == 0:
        raise InputError("the input holds no rows", where=str(dataset), hint="point dataset_path at non-empty JSONL")
    if request.num_shards > total_rows:
        raise ConfigError(
            f"num_shards={request.num_shards} is more than the {total_rows} input rows",
            where="num_shards",
            hint=f"use at most {total_rows} shards",
        )

    fsio.makedirs(layout.root)
    confine.check_ours(layout)  # never litter a directory that is not a job (or planted links)
    token = f"{int(time.time())}-{os.getpid()}-{secrets.token_hex(4)}"
    staging = layout.staging_dir(token)
    confine.ensure_dir(layout, staging / "shards")
    try:
        shards, content_sha = _pass_two(
            inputs, fingerprints, options, staging / "shards", request.num_shards, total_rows, total_bytes
        )
        _publish_shards(layout, staging / "shards", shards)
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
        )
        staged_manifest = staging / "manifest.json"
        fsio.write_new(staged_manifest, manifest.encode())
        # Published last, exclusively: its presence is what "prepared" means.
        if fsio.publish_exclusive(staged_manifest, layout.manifest):
            logger.info(f"prepared {layout.root}: {total_rows} rows in {request.num_shards} shards")
            return PrepareOutcome(manifest, created=True)
        # A concurrent preparer won; fine if it prepared the same thing.
        return PrepareOutcome(_check_existing(layout, request, dataset, rhash, inputs), created=False)
    finally:
        fsio.remove_tree(staging)


# -- request and inputs ----------------------------------------------------------------------
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


def discover_inputs(dataset: Path) -> list[_Input]:
    """One file, or every ``*.jsonl`` below a directory sorted by relative POSIX path."""
    if dataset.is_file():
        return [_Input(dataset, dataset.name)]
    found: list[_Input] = []
    # os.walk without following directory symlinks: the order and the set of files
    # must not depend on link loops; linked *files* are read like any file.
    for root, dirs, files in os.walk(dataset):
        dirs.sort()
        for name in files:
            if name.endswith(".jsonl"):
                path = Path(root) / name
                found.append(_Input(path, path.relative_to(dataset).as_posix()))
    found.sort(key=lambda item: item.relpath)
    if not found:
        raise InputError("no *.jsonl files found", where=str(dataset), hint="directory inputs are searched recursively")
    return found


def _pass_one(inputs: list[_Input], options: NormaliseOptions) -> tuple[list[InputFile], int]:
    fingerprints: list[InputFile] = []
    total_bytes = 0
    first_index = 0
    input_bytes, read_before = sum(fsio.stat(item.path).st_size for item in inputs), 0
    for item in inputs:
        before = fsio.stat(item.path)
        scan = FileScan()
        for row in iter_normalised(item.path, str(item.path), options, first_index, scan):
            del row  # pass 1 only validates and counts
            if not scan.rows & _REPORT_EVERY:
                steps.report("prepare: validating input", read_before + scan.size, input_bytes)
        read_before += scan.size
        steps.report("prepare: validating input", read_before, input_bytes)
        after = fsio.stat(item.path)
        if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or scan.size != after.st_size:
            raise InputChangedError(
                "input changed while it was being read",
                where=str(item.path),
                hint="stop whatever writes the input and prepare again",
            )
        fingerprints.append(
            InputFile(str(item.path), item.relpath, scan.sha256, after.st_size, after.st_mtime_ns, scan.rows)
        )
        total_bytes += scan.normalised_bytes
        first_index += scan.rows
    return fingerprints, total_bytes


def _pass_two(
    inputs: list[_Input],
    fingerprints: list[InputFile],
    options: NormaliseOptions,
    out_dir: Path,
    n: int,
    total_rows: int,
    total_bytes: int,
) -> tuple[list[ShardEntry], str]:
    splitter = ShardSplitter(out_dir, n, total_rows, total_bytes)
    first_index = 0
    input_bytes, read_before = sum(f.size for f in fingerprints), 0
    try:
        for item, old in zip(inputs, fingerprints, strict=True):
            scan = FileScan()
            try:
                for row in iter_normalised(item.path, str(item.path), options, first_index, scan):
                    if splitter.seen >= total_rows:  # the input grew since pass 1
                        raise _changed(item.path, old, detail="more rows than in the first pass")
                    splitter.add(row)
                    if not scan.rows & _REPORT_EVERY:
                        steps.report("prepare: writing shards", read_before + scan.size, input_bytes)
            except InputError as exc:
                # Pass 1 accepted this file, so a bad row now means it was modified.
                raise _changed(item.path, old, detail=str(exc)) from None
            now = fsio.stat(item.path)
            if (scan.sha256, scan.rows, now.st_size, now.st_mtime_ns) != (old.sha256, old.rows, old.size, old.mtime_ns):
                raise _changed(item.path, old, new_sha=scan.sha256 or None)
            first_index += scan.rows
            read_before += scan.size
            steps.report("prepare: writing shards", read_before, input_bytes)
        if splitter.cum != total_bytes:  # pragma: no cover - implied by equal input hashes
            raise InputChangedError("normalised size differs between passes", where=str(out_dir))
        return splitter.finish(), splitter.content.hexdigest()
    except BaseException:
        splitter.abort()
        raise


def _changed(path: Path, old: InputFile, new_sha: str | None = None, detail: str = "") -> InputChangedError:
    if new_sha is None:
        try:
            new_sha = fsio.file_sha256(path)[1]
        except OSError as exc:
            new_sha = f"unreadable ({exc.strerror})"
    message = f"input changed during prepare: sha256 {old.sha256} -> {new_sha}"
    if detail:
        message += f" ({detail})"
    return InputChangedError(message, where=str(path), hint="keep inputs unchanged while preparing; prepare again")


# -- publication ------------------------------------------------------------------------------
def _publish_shards(layout: JobLayout, staged: Path, shards: list[ShardEntry]) -> None:
    try:
        fsio.move(staged, layout.shards_dir)
        return
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
    # Another preparer (or a crashed earlier run) already placed shards: they must be ours, byte for byte.
    expected = {f"{e.shard_id}.jsonl": e for e in shards}
    present = {n for n in fsio.list_names(layout.shards_dir) if not n.startswith(".")}
    mismatch = sorted(present ^ set(expected))
    for name, entry in expected.items():
        if name in present and fsio.file_sha256(layout.shards_dir / name) != (entry.bytes, entry.sha256):
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
    return hashlib.sha256(canonical_json(identity)).hexdigest()


def _check_existing(
    layout: JobLayout, request: PrepareRequest, dataset: Path, rhash: str, inputs: list[_Input]
) -> Manifest:
    manifest = load_manifest(layout.root)
    differences = []
    for name, old, new in (
        ("dataset_path", manifest.dataset_path, str(dataset)),
        ("num_shards", manifest.num_shards, request.num_shards),
        ("recipe hash", manifest.recipe_hash, rhash),
        ("stage identities", manifest.stage_identities, list(request.stage_identities)),
        ("media_keys", manifest.media_keys, _media_keys(request)),
        ("index_key", manifest.index_key, request.index_key),
    ):
        if old != new and name == "stage identities":
            at = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
            differences.append(f"stage identities differ from stage {at} on ({len(old)} stages before, {len(new)} now)")
        elif old != new:
            differences.append(f"{name} was {old!r}, now {new!r}")
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
