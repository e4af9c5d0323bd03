"""The rows whose hashing raised in a signature run (``SignatureOutput.failed``), as the job's quarantine
keeps them: their lines of the signature attempt's quarantine file (``errors.jsonl``, op
``elastic_dedup_hash``), for the merge to put among the shard's own quarantined rows in input order
(``shards.side_files.stage_errors``).

The signature file names the attempt's quarantine file and records its lines, bytes and sha256
(:func:`errors_digest`, at publication); the merge reads it back only for a stage whose ``cluster.json``
counts failed rows, checks it against that record, and keeps exactly one line per failed row (any other
line of the file is a row an operator before the deduplicator failed on: the shard's own run quarantines
it again).  A file that does not check is refused (``errors.IntegrityError``), as any quarantine file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from data_juicer_elastic.dedup.phase_records import CLUSTER_KIND, read_phase_record
from data_juicer_elastic.dedup.signatures import open_signatures
from data_juicer_elastic.dedup.stages import dedup_stages, stage_identity
from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import Manifest
from data_juicer_elastic.sharedfs import fsio

HASH_OP = "elastic_dedup_hash"  # the operator the signature run hashes with (execution.dedup_ops)


def errors_digest(path: Path | None) -> dict[str, Any] | None:
    """``{"rows", "bytes", "sha256"}`` of a quarantine file (None: no file)."""
    if path is None or not fsio.exists(path):
        return None
    digest, size, rows = hashlib.sha256(), 0, 0
    for chunk in fsio.iter_chunks(path):
        digest.update(chunk)
        size, rows = size + len(chunk), rows + chunk.count(b"\n")
    return {"rows": rows, "bytes": size, "sha256": digest.hexdigest()}


def hash_failure_lines(layout: JobLayout, manifest: Manifest) -> dict[str, list[tuple[int, bytes]]]:
    """Shard id -> (input row within the shard, its quarantine line) of every row whose hashing raised,
    over every stage, sorted by row; {} when no stage counts one (no signature file is read then)."""
    found: dict[str, list[tuple[int, bytes]]] = {}
    for stage in dedup_stages(manifest.recipe.get("process") or []):
        identity = stage_identity(manifest.recipe_hash, stage)
        marker = read_phase_record(layout.dedup_cluster(stage.number), CLUSTER_KIND, identity)
        if marker is None:
            raise IntegrityError(
                f"deduplication stage {stage.number} ({stage.op_name}) has no decision (cluster.json)",
                where=str(layout.dedup_cluster(stage.number)),
                hint="run the job's workers again: they decide it before the shards",
            )
        if not marker.get("failed"):
            continue
        counted = 0
        for entry in manifest.shards:
            lines = _shard_failures(layout, stage.number, entry.shard_id, identity)
            counted += len(lines)
            found.setdefault(entry.shard_id, []).extend(lines)
        if counted != marker["failed"]:
            raise IntegrityError(
                f"deduplication stage {stage.number}: {counted} quarantined hashing failures found, "
                f"its cluster.json counts {marker['failed']}",
                where=str(layout.dedup_stage(stage.number)),
                hint="the job directory was modified; remove its dedup directory and run the job again",
            )
    return {shard: sorted(lines, key=lambda item: item[0]) for shard, lines in found.items()}


def _shard_failures(layout: JobLayout, stage: int, shard_id: str, identity: str) -> list[tuple[int, bytes]]:
    path = layout.dedup_signatures(stage, shard_id)
    meta = open_signatures(path, identity=identity).meta
    failed = set(meta.get("failed") or ())
    if not failed:
        return []
    relative, recorded = meta.get("errors"), meta.get("errors_digest")
    where = str(path)
    if not relative or recorded is None:
        raise IntegrityError(f"{len(failed)} row(s) failed hashing but no quarantine file is recorded", where=where)
    errors = layout.resolve_relative(relative)
    if errors_digest(errors) != recorded:
        raise IntegrityError(
            "the signature attempt's quarantine file is missing or does not match its record",
            where=str(errors),
            hint="remove the signature file (the stage is then decided again) or run the job with a new job_dir",
        )
    lines = []
    with fsio.open_read(errors) as handle:
        for line in handle:
            record = json.loads(line)
            if record.get("op") == HASH_OP and record.get("shard_row") in failed:
                lines.append((int(record["shard_row"]), line if line.endswith(b"\n") else line + b"\n"))
    if sorted(row for row, _ in lines) != sorted(failed):
        raise IntegrityError(f"the quarantine file {relative} does not hold one line per row whose hashing failed",
                             where=where)  # fmt: skip
    return lines
