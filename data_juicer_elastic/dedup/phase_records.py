"""The small records of the deduplication phases: a stage's bucket plan (``dedup/<k>/buckets/plan.json``)
and its cluster marker (``dedup/<k>/cluster.json``), each a canonical JSON body with its own sha256,
written for the stage's identity (``stages.stage_identity``) and published first-wins.

A record that is truncated, tampered with or written for another identity (another recipe) is refused
(``errors.IntegrityError``): the plan is then recomputed (it is a function of the signature files) and
published in its place; a refused marker makes the cluster task run again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.jobdir.records import canonical_json
from data_juicer_elastic.sharedfs import fsio

PLAN_KIND: Final = "dedup-bucket-plan"
CLUSTER_KIND: Final = "dedup-cluster"
MAX_RECORD_BYTES: Final = 64 * 1024 * 1024


def encode_phase_record(kind: str, identity: str, body: dict[str, Any]) -> bytes:
    """``body`` with its kind and identity, and the sha256 of all of it (canonical JSON)."""
    content = {**body, "kind": kind, "identity": identity}
    return canonical_json({**content, "sha256": hashlib.sha256(canonical_json(content)).hexdigest()})


def read_phase_record(path: Path, kind: str, identity: str) -> dict[str, Any] | None:
    """The record at ``path`` checked (None when there is none); IntegrityError when refused."""
    data = fsio.read_record(path, MAX_RECORD_BYTES)
    if data is None:
        return None
    try:
        content = json.loads(data)
        digest = content.pop("sha256")
        intact = isinstance(content, dict) and hashlib.sha256(canonical_json(content)).hexdigest() == digest
    except (ValueError, KeyError, AttributeError, TypeError):
        intact = False
    if not intact:
        raise IntegrityError(
            "is truncated or was changed after it was written (its sha256 does not match)",
            where=str(path),
            hint="it is recomputed",
        )
    if content.get("kind") != kind:
        raise IntegrityError(f"is a {content.get('kind')!r} record, not a {kind!r} one", where=str(path))
    if content.get("identity") != identity:
        raise IntegrityError(
            f"was written for {content.get('identity')!r}, not {identity!r} (a different recipe or stage)",
            where=str(path),
            hint="it is recomputed",
        )
    return content


def publish_phase_record(path: Path, kind: str, identity: str, body: dict[str, Any]) -> dict[str, Any]:
    """Publish a record first-wins and return the one there: ours, or a valid one published first
    (identical for a deterministic body); a refused one is removed and ours published."""
    data = encode_phase_record(kind, identity, body)
    fsio.makedirs(Path(path).parent)
    for _ in range(3):
        if fsio.publish_bytes(path, data):
            return json.loads(data)
        try:
            found = read_phase_record(path, kind, identity)
        except IntegrityError:
            fsio.remove(path)
            continue
        if found is not None:
            return found
    raise IntegrityError("could not be published (refused three times)", where=str(path))
