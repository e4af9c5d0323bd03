"""The records of a planned job: ``plan.json`` (:class:`JobPlan`: the inputs and each shard's byte
spans, decided without reading the data) and each shard's scan record ``scans/done/<shard>.json``
(:class:`ScanResult`).  The plan, the scans and a shard's *content*: docs/input-format.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from data_juicer_elastic.jobdir.records import ChecksummedRecord, ShardSpan


@dataclass(frozen=True)
class PlannedInput:
    path: str  # absolute path as given at prepare time
    relpath: str  # POSIX path relative to the dataset root (file name for single-file input)
    codec: str  # "none" | "gzip" | "zstd" (rows.codecs)
    size: int  # bytes as stored when planned
    mtime_ns: int


@dataclass(frozen=True)
class PlannedShard:
    shard_id: str
    index: int
    spans: list[ShardSpan]
    bytes: int  # stored bytes of the spans (what the plan balanced)


@dataclass(frozen=True)
class JobPlan(ChecksummedRecord):
    """Everything prepare decides without reading the data (``plan.json``)."""

    KIND: ClassVar[str] = "plan"
    job_id: str
    created_at: float
    dataset_path: str
    dataset_kind: str  # "file" | "directory"
    inputs: list[PlannedInput]
    num_shards: int
    recipe_hash: str
    recipe: dict[str, Any]
    stage_identities: list[str]
    media_keys: dict[str, str]
    index_key: str | None
    versions: dict[str, str]
    ray: dict[str, Any]
    settings: dict[str, Any]
    shards: list[PlannedShard]
    request_fingerprint: str
    max_line_bytes: int
    shard_codec: str = "none"  # how copied shards are stored (copy_shards only)
    copy_shards: bool = False  # scans copy each shard into shards/ (else: shards are byte ranges of the inputs)
    code: dict[str, Any] | None = None  # fingerprint of the operator code (execution.code_fingerprint)
    planned_bytes_read: int = 0  # bytes the planner read to place the cuts (serial work, for the report)
    # the recipe's export_path at prepare, absolute: where ``dj-elastic merge`` writes without --output
    # (not part of the job's identity: a later run may export the same shards elsewhere)
    export_path: str | None = None
    checksum: str | None = None

    @property
    def shard_ids(self) -> list[str]:
        return [entry.shard_id for entry in self.shards]

    @property
    def total_bytes(self) -> int:
        return sum(entry.bytes for entry in self.shards)


@dataclass(frozen=True)
class ScanRefusal:
    """Why a scan refused its shard's input: a row (``line``, 1-based within span ``span``) or a
    whole file (``line`` None: corrupt compression, changed since planning)."""

    span: int
    line: int | None
    message: str
    hint: str | None
    error_type: str  # "InputError" | "InputChangedError"


@dataclass(frozen=True)
class ScanResult(ChecksummedRecord):
    """One shard's scan, published at ``scans/done/<shard>.json`` (first wins)."""

    KIND: ClassVar[str] = "scan"
    shard_id: str
    attempt_id: str
    generation: int
    node_id: str
    rows: int
    bytes: int  # the shard's content bytes (see the module docstring)
    sha256: str  # of the content
    span_rows: list[int]  # rows of each span, in order (line numbers of errors, rows per input file)
    schema: list[Any]  # rows.row_schema.RowSchema.to_json() of the shard's rows
    normalise: bool  # some row needs normalising when read (rows.jsonl: media paths, index key, blanks, CRLF, BOM)
    longest_line: int  # bytes of the longest line (without its newline)
    started_at: float
    finished_at: float
    refusal: ScanRefusal | None = None  # set: the input is refused, the job must not run
    copy: str | None = None  # copy_shards: the copy inside the scan attempt's directory (relative to the job dir)
    stored_bytes: int | None = None  # of the copy as stored, when a shard codec compresses it
    stored_sha256: str | None = None
    checksum: str | None = None
