"""The job's plan and manifest: loading and validating them, where a shard's content is
(:func:`locate_shard`), the scans' results published and composed into the manifest, how the scans
ended, and ``manifest-rows.json`` (what ``status`` reads instead of decoding the manifest).
"""

from __future__ import annotations

import copy
import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, NamedTuple

import msgspec
from loguru import logger

from data_juicer_elastic.errors import (
    ConfigError,
    InputError,
    IntegrityError,
    JobDirError,
)
from data_juicer_elastic.jobdir.attempts import ScanOutput, read_done
from data_juicer_elastic.jobdir.layout import JobLayout, check_inside, ensure_dir, not_a_directory, shard_id, shard_ids
from data_juicer_elastic.jobdir.records import (
    FORMAT_PREFIX,
    VERSION,
    Claim,
    InputFile,
    JobPlan,
    Manifest,
    PlannedInput,
    ScanResult,
    ScanSummary,
    ShardEntry,
    ShardSpan,
    canonical_json,
    record_checksum,
)
from data_juicer_elastic.jobdir.shard_state import ended_scans_error
from data_juicer_elastic.rows.codecs import SHARD_SUFFIX
from data_juicer_elastic.rows.jsonl import NormaliseOptions
from data_juicer_elastic.rows.row_schema import RowSchema, operator_view_notes
from data_juicer_elastic.rows.shard_source import ShardSource, SourceSpan, check_source
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

_SHA256: Final = re.compile(r"^[0-9a-f]{64}$")


def manifest_recipe_hash(recipe: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a recipe dict as the manifest holds it (the job's recipe
    identity; ``integration.recipe.recipe_hash`` canonicalises a built recipe, then calls this)."""
    try:
        return hashlib.sha256(canonical_json(recipe)).hexdigest()
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the recipe is not plain JSON data: {exc}",
            where="recipe",
            hint="recipe values must be str, int, float, bool, None, lists and dicts",
        ) from exc


def load_manifest(job_dir: str | Path, *, entries: bool = True) -> Manifest:
    """The validated manifest of ``job_dir``; JobDirError when missing, corrupt or inconsistent.

    ``entries=False`` (``dj-elastic status``): :class:`ShardRow` tuples in ``shards`` instead of
    validated :class:`ShardEntry` records, which are most of a 100,000-shard manifest's load time:
    from ``manifest-rows.json`` when it was made from these very bytes (``jobdir.manifest``:
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
    try:  # msgspec: a 100,000-shard manifest decodes in a third of json's time; integers stay exact
        obj = msgspec.json.decode(data)  # (orjson turns one beyond 64 bits into a float); NaN refused
    except msgspec.DecodeError as exc:
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
    # msgspec's sorted compact form is canonical_json's bytes for what prepare writes (5x faster);
    # where they could differ (a float's exponent) the digests differ and the full path decides
    if _checksum({key: value for key, value in obj.items() if key != "checksum"}) != obj["checksum"]:
        return None
    try:
        entries = obj["shards"]
        head = Manifest.from_object({**obj, "shards": []}, where)
        n = len(entries)
        ids = [e["shard_id"] for e in entries]
        # the ids and indexes prepare writes, compared as whole lists (no call per shard)
        if head.num_shards != n or [e["index"] for e in entries] != list(range(n)) or ids != shard_ids(n):
            return None
        return _rows_manifest(head, ids, [e["rows"] for e in entries], _span_bytes(entries))
    except (KeyError, TypeError, JobDirError, ConfigError):
        return None


def _span_bytes(entries: list[dict]) -> list[int]:
    """Each manifest entry's span bytes (a single span's length without a call per shard)."""
    return [s[0]["length"] if len(s := e["spans"]) == 1 else sum(span["length"] for span in s) for e in entries]


def _rows_manifest(head: Manifest, ids: list[str], rows: list[int], span_bytes: list[int]) -> Manifest:
    """``head`` with :class:`ShardRow` shards: the fields a display reads."""
    new_row = tuple.__new__  # ShardRow's own __new__ is a Python call per shard
    shards = [new_row(ShardRow, item) for item in zip(ids, range(len(ids)), rows, span_bytes, strict=True)]
    return replace(head, shards=shards)  # type: ignore[arg-type]


def _read_job_record(layout: JobLayout, path: Path) -> bytes | None:
    """The bytes of the plan or the manifest (None when absent); a file in the job dir's place is one error."""
    try:
        return fsio.read_record(path, MAX_MANIFEST_BYTES)
    except NotADirectoryError:
        raise not_a_directory(layout.root) from None


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
    check_inside(layout, path)
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


# manifest-rows.json: a 100,000-shard manifest is 38 MB of JSON, and decoding it is most of what
# ``dj-elastic status`` costs; the record (0.6 MB) is trusted only when its checksum matches and it was
# made from exactly the manifest's bytes (docs/status.md).  Workers, merge and verify never read it.
RECORD_FORMAT: Final = FORMAT_PREFIX + "manifest-rows"
MAX_MANIFEST_BYTES: Final = 256 * 1024 * 1024  # 100k shards + a large recipe stay far below
MAX_ROWS_RECORD_BYTES: Final = 64 * 1024 * 1024  # 99,999 shards: 0.6 MB


class ShardRow(NamedTuple):
    """What a read-only display needs of a shard's manifest entry (``load_manifest(entries=False)``)."""

    shard_id: str
    index: int
    rows: int
    span_bytes: int  # the sum of its spans' lengths (the stored bytes it reads)

    @property
    def spans(self) -> list[ShardSpan]:
        """One span of the shard's bytes, for what sums span lengths (status's scan line)."""
        return [ShardSpan(0, 0, self.span_bytes)]


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(msgspec.json.encode(body, order="sorted")).hexdigest()


def encode_rows_record(manifest_bytes: bytes) -> bytes:
    """The record of the manifest file of these bytes."""
    obj = msgspec.json.decode(manifest_bytes)
    shards = obj["shards"]
    body = {
        "format": RECORD_FORMAT,
        "version": VERSION,
        "job_id": obj["job_id"],
        "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
        "head": {key: value for key, value in obj.items() if key != "shards"},
        "rows": [e["rows"] for e in shards],
        "span_bytes": _span_bytes(shards),
    }
    return msgspec.json.encode({**body, "checksum": _checksum(body)})


def publish_rows_record(layout: JobLayout) -> None:
    """Write the record of the published manifest (first wins: every publisher derives the same
    bytes from the same file).  Best effort: without it a reader decodes the manifest itself."""
    try:
        data = fsio.read_record(layout.manifest, MAX_MANIFEST_BYTES)
        if data is not None:
            fsio.publish_bytes(layout.manifest_rows, encode_rows_record(data))
    except OSError:
        pass  # e.g. a full disk: the job is prepared all the same; status decodes the manifest


def read_rows_record(layout: JobLayout) -> Manifest | None:
    """The manifest with :class:`ShardRow` shards from the record, or None when it is missing or
    was not made from the bytes of ``manifest.json`` as it is now (hashed as they are read, never
    held whole: the caller then reads and decodes the manifest itself)."""
    try:
        data = fsio.read_record(layout.manifest_rows, MAX_ROWS_RECORD_BYTES)
        if data is None:
            return None
        obj = msgspec.json.decode(data)
        body = {key: value for key, value in obj.items() if key != "checksum"}
        if obj.get("format") != RECORD_FORMAT or obj.get("version") != VERSION or _checksum(body) != obj["checksum"]:
            return None
        if obj["manifest_sha256"] != fsio.file_sha256(layout.manifest)[1]:
            return None
        head = Manifest.from_object({**obj["head"], "shards": []}, str(layout.manifest))
        rows, spans = obj["rows"], obj["span_bytes"]
        n = head.num_shards
        if head.job_id != obj["job_id"] or len(rows) != n or len(spans) != n:
            return None
        return _rows_manifest(head, shard_ids(n), rows, spans)
    except (OSError, msgspec.DecodeError, KeyError, TypeError, AttributeError, JobDirError, ConfigError):
        return None


# The manifest's fields that are the plan's, as they are.
_FROM_PLAN: Final = (
    "job_id created_at dataset_path dataset_kind num_shards recipe_hash recipe stage_identities media_keys index_key "
    "versions ray settings request_fingerprint shard_codec copy_shards code".split()
)


def publish_scan(
    layout: JobLayout, claim: Claim, attempt_dir: Path, output: ScanOutput, identity: WorkerIdentity, started: float
) -> tuple[bool, ScanResult]:
    """Publish a scan's result for its shard; (accepted, the result that stands)."""
    scans = layout.scans
    found = {name: value for name, value in vars(output).items() if name not in ("span_rows", "copy_path")}
    result = ScanResult(
        shard_id=claim.shard_id,
        attempt_id=claim.attempt_id,
        generation=claim.generation,
        node_id=identity.node_id,
        span_rows=list(output.span_rows),
        started_at=started,
        finished_at=time.time(),
        copy=None if output.copy_path is None else layout.relative(output.copy_path),
        **found,  # what the scan found: its fields of the same names
    )
    staged = attempt_dir / "result.json"
    fsio.write_new(staged, result.encode())
    ensure_dir(layout, scans.done_dir)
    if fsio.publish_exclusive(staged, scans.done(claim.shard_id)):
        return True, result
    winner, _ = read_done(scans, claim.shard_id)
    return False, winner if isinstance(winner, ScanResult) else result


def compose_manifest(plan: JobPlan, results: dict[str, ScanResult]) -> Manifest:
    """The manifest of a fully scanned job with no refusals: the same for every composer."""
    schema = RowSchema()
    entries, first, input_rows = [], 0, [0] * len(plan.inputs)
    for planned in plan.shards:
        result = results[planned.shard_id]
        schema.merge(RowSchema.from_json(result.schema))
        spans = [
            ShardSpan(s.input, s.offset, s.length, rows)
            for s, rows in zip(planned.spans, result.span_rows, strict=True)
        ]
        for span in spans:
            input_rows[span.input] += span.rows or 0
        content = (result.rows, result.bytes, result.sha256, result.stored_bytes, result.stored_sha256)
        entries.append(ShardEntry(planned.shard_id, planned.index, first, *content, spans, result.normalise))
        first += result.rows
    if first == 0:
        raise InputError(
            "the input holds no rows", where=plan.dataset_path, hint="point dataset_path at non-empty JSONL"
        )
    inputs = [
        InputFile(i.path, i.relpath, None, i.size, i.mtime_ns, rows, i.codec)
        for i, rows in zip(plan.inputs, input_rows, strict=True)
    ]
    digests = canonical_json([[e.bytes, e.sha256] for e in entries])
    scan = ScanSummary(
        planned_at=plan.created_at,
        started_at=min(r.started_at for r in results.values()),
        finished_at=max(r.finished_at for r in results.values()),
        bytes_read_to_plan=plan.planned_bytes_read,
    )
    return Manifest(
        **{name: copy.copy(getattr(plan, name)) for name in _FROM_PLAN},  # shallow copies, as the plan's own
        inputs=inputs,
        total_rows=first,
        total_bytes=sum(e.bytes for e in entries),
        content_sha256=hashlib.sha256(digests).hexdigest(),
        shards=entries,
        row_schema=schema.to_json(),
        scan=scan,
    )


def publish_manifest(layout: JobLayout, plan: JobPlan, results: dict[str, ScanResult]) -> Manifest:
    """Compose and publish the manifest (first wins; every composer writes the same bytes), after
    placing copied shards at ``shards/<id>`` (with ``copy_shards``)."""
    manifest = compose_manifest(plan, results)
    if plan.copy_shards:
        _place_copies(layout, plan, results)
    if fsio.publish_bytes(layout.manifest, manifest.encode()):
        warn_operator_views(manifest.row_schema)  # once per job: where the input's types become known
    else:
        published = load_manifest(layout.root)
        if published.job_id != manifest.job_id or published.content_sha256 != manifest.content_sha256:
            raise JobDirError(
                "manifest.json describes other shards than this job's scans",
                where=str(layout.manifest),
                hint="the job directory was modified; prepare a new job_dir",
            )
    published = load_manifest(layout.root)  # validated as every reader does
    publish_rows_record(layout)  # what status reads instead of decoding the manifest
    return published


def _place_copies(layout: JobLayout, plan: JobPlan, results: dict[str, ScanResult]) -> None:
    ensure_dir(layout, layout.shards_dir)
    suffix = SHARD_SUFFIX[plan.shard_codec]
    for entry in plan.shards:
        source = layout.resolve_relative(results[entry.shard_id].copy or "")
        target = layout.shard(entry.shard_id, suffix)
        if _same_file(source, target) or fsio.publish_exclusive(source, target):
            continue
        raise JobDirError(
            f"shards/ holds a file for {entry.shard_id} that is not its accepted scan's copy",
            where=str(target),
            hint="the job directory was modified; prepare a new job_dir",
        )


def _same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = fsio.stat(a), fsio.stat(b)
    except FileNotFoundError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def warn_operator_views(row_schema: list[Any] | None) -> None:
    """Warn about the input's values that operators see in another type (docs/lossless.md)."""
    if row_schema is not None:
        for note in operator_view_notes(RowSchema.from_json(row_schema)):
            logger.warning(f"{note} (the output keeps every untouched value as it was; see docs/lossless.md)")
