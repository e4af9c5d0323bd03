"""Loading and validating a job's plan (what prepare decided) and manifest (the plan and its scans
composed: the one record that says "this job's input is known and may run"), and where a
shard's content is (:func:`locate_shard`)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import orjson

from data_juicer_elastic.errors import ConfigError, IntegrityError, JobDirError
from data_juicer_elastic.jobdir import confine
from data_juicer_elastic.jobdir.layout import JobLayout, shard_id, shard_ids
from data_juicer_elastic.jobdir.manifest_rows import MAX_MANIFEST_BYTES, ShardRow, read_rows_record
from data_juicer_elastic.jobdir.plan_records import JobPlan, PlannedInput
from data_juicer_elastic.jobdir.records import (
    InputFile,
    Manifest,
    ShardEntry,
    ShardSpan,
    manifest_recipe_hash,
    record_checksum,
)
from data_juicer_elastic.jobdir.scan_outcome import ended_scans_error
from data_juicer_elastic.rows.codecs import SHARD_SUFFIX
from data_juicer_elastic.rows.jsonl import NormaliseOptions
from data_juicer_elastic.rows.shard_source import ShardSource, SourceSpan, check_source
from data_juicer_elastic.sharedfs import fsio

_SHA256: Final = re.compile(r"^[0-9a-f]{64}$")


def load_manifest(job_dir: str | Path, *, entries: bool = True) -> Manifest:
    """The validated manifest of ``job_dir``; JobDirError when missing, corrupt or inconsistent.

    ``entries=False`` (``dj-elastic status``): :class:`ShardRow` tuples in ``shards`` instead of
    validated :class:`ShardEntry` records, which are most of a 100,000-shard manifest's load time:
    from ``manifest-rows.json`` when it was made from these very bytes (``jobdir.manifest_rows``:
    the bytes are hashed, not decoded), else from the decoded manifest when its checksum matches
    (it is byte for byte what prepare validated and wrote); anything unexpected takes the full
    path, which names the error."""
    layout = JobLayout(job_dir)
    if not entries and (rows := read_rows_record(layout)) is not None:  # its small record beside it
        return rows
    data = _read_job_record(layout, layout.manifest)
    if data is None:
        if fsio.exists(layout.plan):
            ended = ended_scans_error(layout, load_plan(layout.root))
            if ended is not None:  # the scans refused the input: starting workers would only repeat that
                raise ended
            raise JobDirError(
                "the job is planned but its shards are not all scanned yet (no manifest.json)",
                where=str(layout.root),
                hint="start workers (dj-elastic worker, or dj-process): they scan every shard first",
            )
        raise _not_prepared(layout, "manifest.json")
    try:  # orjson: a 100,000-shard manifest (38 MB) decodes in a third of json's time; it refuses NaN too
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise JobDirError(f"corrupt manifest record: {exc}", where=str(layout.manifest)) from None
    if not entries and (light := _light_manifest(obj, str(layout.manifest))) is not None:
        return light
    manifest = Manifest.from_object(obj, str(layout.manifest))
    validate_manifest(manifest, str(layout.manifest))
    if manifest.checksum is not None:  # manifests written before the checksum existed carry none
        actual = record_checksum(obj)  # the object decoded once above
        if actual != manifest.checksum:
            raise JobDirError(
                f"manifest checksum mismatch: recorded {manifest.checksum}, content hashes to {actual}",
                where=str(layout.manifest),
                hint="the manifest was modified or damaged after prepare; prepare a new job_dir",
            )
    return manifest


def _light_manifest(obj: Any, where: str) -> Manifest | None:
    """The manifest with :class:`ShardRow` shards, when its checksum matches and each entry has
    the shape prepare writes; else None (the caller takes the full path)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("shards"), list) or not obj.get("checksum"):
        return None
    # orjson's sorted compact form is canonical_json's bytes for what prepare writes (5x faster);
    # where they could differ (a float's exponent) the digests differ and the full path decides
    body = {key: value for key, value in obj.items() if key != "checksum"}
    if hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest() != obj["checksum"]:
        return None
    try:
        entries = obj["shards"]
        head = Manifest.from_object({**obj, "shards": []}, where)
        n = len(entries)
        ids = [e["shard_id"] for e in entries]
        # the ids and indexes prepare writes, compared as whole lists (no call per shard)
        if head.num_shards != n or [e["index"] for e in entries] != list(range(n)) or ids != shard_ids(n):
            return None
        new_row = tuple.__new__  # ShardRow's own __new__ is a Python call per shard
        rows = [
            new_row(ShardRow, (shard, i, e["rows"], s[0]["length"] if len(s := e["spans"]) == 1 else _span_bytes(s)))
            for i, (shard, e) in enumerate(zip(ids, entries, strict=True))
        ]
    except (KeyError, TypeError, JobDirError, ConfigError):
        return None
    return replace(head, shards=rows)  # type: ignore[arg-type]  # ShardRow: the fields a display reads


def _span_bytes(spans: list[dict]) -> int:
    return spans[0]["length"] if len(spans) == 1 else sum(span["length"] for span in spans)


def _read_job_record(layout: JobLayout, path: Path) -> bytes | None:
    """The bytes of the plan or the manifest (None when absent); a file in the job dir's place is one error."""
    try:
        return fsio.read_record(path, MAX_MANIFEST_BYTES)
    except NotADirectoryError:
        raise confine.not_a_directory(layout.root) from None


def _not_prepared(layout: JobLayout, name: str) -> JobDirError:
    return JobDirError(
        f"job directory is not prepared (no {name})",
        where=str(layout.root),
        hint="run dj-elastic prepare (or dj-process with executor_type: elastic_sharded) first",
    )


def validate_manifest(manifest: Manifest, where: str) -> None:
    """Cross-field checks a type check cannot do; every worker runs them before claiming."""

    def bad(message: str) -> JobDirError:
        return JobDirError(
            f"inconsistent manifest: {message}",
            where=where,
            hint="the job directory is corrupt; prepare a new job_dir",
        )

    if manifest.num_shards < 1 or len(manifest.shards) != manifest.num_shards:
        raise bad(f"num_shards is {manifest.num_shards} but {len(manifest.shards)} shards are listed")
    next_row = 0
    for i, entry in enumerate(manifest.shards):
        if entry.shard_id != shard_id(i, manifest.num_shards) or entry.index != i:
            raise bad(f"shard {i} is {entry.shard_id!r} (index {entry.index})")
        # A planned shard may be empty (a unit larger than its share); then it has no rows and no bytes.
        if entry.rows < 0 or (entry.rows == 0) != (entry.bytes == 0):
            raise bad(f"shard {entry.shard_id} is empty")
        if not manifest.copy_shards:
            _check_spans(entry.shard_id, entry.spans, manifest.inputs, bad)
            if any(span.rows is None for span in entry.spans):
                raise bad(f"shard {entry.shard_id} has a span outside its input file")
            if sum(span.rows or 0 for span in entry.spans) != entry.rows:
                raise bad(f"shard {entry.shard_id}'s spans do not add up to its rows")
        if entry.first_row != next_row:
            raise bad(f"shard {entry.shard_id} starts at row {entry.first_row}, expected {next_row}")
        if not _SHA256.match(entry.sha256):
            raise bad(f"shard {entry.shard_id} has a malformed sha256")
        compressed = manifest.shard_codec != "none" and manifest.copy_shards
        if compressed != (entry.stored_bytes is not None and entry.stored_sha256 is not None) or (
            compressed and not _SHA256.match(entry.stored_sha256 or "")
        ):
            raise bad(f"shard {entry.shard_id} does not describe its {manifest.shard_codec} file")
        next_row += entry.rows
    if next_row != manifest.total_rows:
        raise bad(f"shards hold {next_row} rows but total_rows is {manifest.total_rows}")
    if sum(e.bytes for e in manifest.shards) != manifest.total_bytes:
        raise bad("shard sizes do not add up to total_bytes")
    if sum(f.rows for f in manifest.inputs) != manifest.total_rows:
        raise bad("input rows do not add up to total_rows")
    if manifest_recipe_hash(manifest.recipe) != manifest.recipe_hash:
        raise bad("recipe_hash does not match the recorded recipe")
    if manifest.shard_codec not in SHARD_SUFFIX:
        raise bad(f"unknown shard_codec {manifest.shard_codec!r}")
    if manifest.dataset_kind not in ("file", "directory"):
        raise bad(f"unknown dataset_kind {manifest.dataset_kind!r}")


def _check_spans(shard: str, spans: list[ShardSpan], inputs: Sequence[InputFile | PlannedInput], bad) -> None:
    """Each span names an input and lies inside it (the plan's and the manifest's spans alike)."""
    for span in spans:
        if not 0 <= span.input < len(inputs):
            raise bad(f"shard {shard} names input {span.input}")
        if span.offset < 0 or span.length < 1 or span.offset + span.length > inputs[span.input].size:
            raise bad(f"shard {shard} has a span outside its input file")


def load_plan(job_dir: str | Path) -> JobPlan:
    """The validated plan of ``job_dir`` (what prepare published); JobDirError when missing or corrupt."""
    layout = JobLayout(job_dir)
    data = _read_job_record(layout, layout.plan)
    if data is None:
        raise _not_prepared(layout, "plan.json")
    plan = JobPlan.parse_checked(data, layout.plan)

    def bad(message: str) -> JobDirError:
        return JobDirError(f"inconsistent plan: {message}", where=str(layout.plan), hint="prepare a new job_dir")

    if plan.num_shards < 1 or len(plan.shards) != plan.num_shards:
        raise bad(f"num_shards is {plan.num_shards} but {len(plan.shards)} shards are listed")
    for i, entry in enumerate(plan.shards):
        if entry.shard_id != shard_id(i, plan.num_shards) or entry.index != i:
            raise bad(f"shard {i} is {entry.shard_id!r} (index {entry.index})")
        _check_spans(entry.shard_id, entry.spans, plan.inputs, bad)
    if manifest_recipe_hash(plan.recipe) != plan.recipe_hash:
        raise bad("recipe_hash does not match the recorded recipe")
    return plan


def recorded_export_path(job_dir: str | Path) -> str:
    """``export_path`` of the recipe the job was prepared from (its plan's): ``dj-elastic merge``'s default output."""
    recorded = load_plan(job_dir).export_path
    if not recorded:
        raise ConfigError(
            "the job records no export_path to merge into (its recipe had none, or it was prepared by an "
            "earlier version)",
            where="--output",
            hint="give the output with --output PATH",
        )
    return recorded


def load_job(job_dir: str | Path) -> Manifest | JobPlan:
    """The manifest once the job is scanned, else its plan: what a worker needs to start (the
    recipe, its code, the settings) is in both."""
    return load_manifest(job_dir) if fsio.exists(JobLayout(job_dir).manifest) else load_plan(job_dir)


def normalise_options(job: JobPlan | Manifest, **limits: int) -> NormaliseOptions:
    """How the job's rows are normalised (media paths resolved against the dataset's directory,
    the index key); ``limits``: ``max_line_bytes`` where the job's own applies (its scans)."""
    dataset = Path(job.dataset_path)
    return NormaliseOptions(
        base_dir=str(dataset.parent if job.dataset_kind == "file" else dataset),
        media_keys=job.media_keys,
        index_key=job.index_key,
        **limits,
    )


def source_spans(inputs: Sequence[InputFile | PlannedInput], spans: list[ShardSpan]) -> tuple[SourceSpan, ...]:
    """A shard's spans as a reader sees them: each file with its codec and its planned size and
    mtime (rows: 0 in a plan, before the scans count them)."""
    return tuple(
        SourceSpan(
            path=inputs[span.input].path,
            offset=span.offset,
            length=span.length,
            codec=inputs[span.input].codec,
            size=inputs[span.input].size,
            mtime_ns=inputs[span.input].mtime_ns,
            rows=span.rows or 0,
        )
        for span in spans
    )


def locate_shard(layout: JobLayout, manifest: Manifest, entry: ShardEntry) -> ShardSource:
    """Where ``entry``'s content is (its spans of the inputs, or its copy) and what it hashes to."""
    copy = str(layout.shard(entry.shard_id, SHARD_SUFFIX[manifest.shard_codec])) if manifest.copy_shards else None
    return ShardSource(
        entry.shard_id,
        source_spans(manifest.inputs, entry.spans),
        entry.bytes,
        entry.sha256,
        entry.first_row,
        normalise_options(manifest) if entry.normalise else None,
        copy,
        manifest.shard_codec if manifest.copy_shards else "none",
    )


def check_shard_files(job_dir: str | Path, manifest: Manifest) -> None:
    """Refuse a job whose ``shards/`` lacks input shards, before anything is claimed.  One listing, not
    an open per shard: a stale NFS listing may pass a file deleted moments ago; the attempt's sha256
    check catches it."""
    if not manifest.copy_shards:
        return  # shards are read from the inputs (check_shard_file compares each file with the plan)
    layout = JobLayout(job_dir)
    # "<shard id>.jsonl" plus the codec's suffix, if any (.gz, .zst): the file's stem is the id
    present = {name.partition(".jsonl")[0] for name in fsio.list_names(layout.shards_dir) if ".jsonl" in name}
    missing = [e.shard_id for e in manifest.shards if e.shard_id not in present]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise JobDirError(
            f"{len(missing)} input shard file(s) listed in the manifest are missing: {shown}",
            where=str(layout.shards_dir),
            hint="the job directory was modified after prepare; prepare a new job_dir",
        )


def check_shard_file(layout: JobLayout, manifest: Manifest, entry: ShardEntry) -> ShardSource:
    """Where ``entry``'s content is, checked before anything reads it for work: a copied shard inside
    the job directory (UnsafePathError) and of its recorded size and sha256 (IntegrityError); a shard
    read from its inputs, each file of its planned size and mtime (InputChangedError)."""
    source = locate_shard(layout, manifest, entry)
    if not manifest.copy_shards:
        check_source(source)
        return source
    path = layout.shard(entry.shard_id, SHARD_SUFFIX[manifest.shard_codec])
    confine.check_inside(layout, path)
    where = f"shard {entry.shard_id}"
    hint = "the job directory was modified after prepare; prepare a new job_dir"
    if not fsio.exists(path):
        raise IntegrityError(f"input shard file {path} is missing", where=where, hint=hint)
    size, sha = fsio.file_sha256(path)
    expected_size, expected_sha = entry.stored()
    if (size, sha) != (expected_size, expected_sha):
        raise IntegrityError(
            f"input shard is corrupt: expected bytes={expected_size} sha256={expected_sha}, "
            f"found bytes={size} sha256={sha}",
            where=where,
            hint=hint,
        )
    return source
