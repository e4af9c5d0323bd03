"""Scan results: published per shard (``scans/done/<shard>.json``, first wins), then composed with the
plan into the manifest: every instance composes the same bytes, and its presence is the barrier (no
shard runs before the whole input is known good; docs/input-format.md).  A refused input refuses the
job with the first refusal in input order (``scan_outcome.refusal_error``).
"""

from __future__ import annotations

import copy
import hashlib
import time
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.errors import InputError, JobDirError
from data_juicer_elastic.jobdir import confine
from data_juicer_elastic.jobdir.attempts import ScanOutput, read_done
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.lease_records import Claim
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.manifest_rows import publish_rows_record
from data_juicer_elastic.jobdir.plan_records import JobPlan, ScanResult
from data_juicer_elastic.jobdir.records import InputFile, Manifest, ScanSummary, ShardEntry, ShardSpan, canonical_json
from data_juicer_elastic.rows.codecs import SHARD_SUFFIX
from data_juicer_elastic.rows.row_schema import RowSchema, operator_view_notes
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

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
    confine.ensure_dir(layout, scans.done_dir)
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
    confine.ensure_dir(layout, layout.shards_dir)
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
