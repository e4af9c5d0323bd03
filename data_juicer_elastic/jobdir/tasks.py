"""What the worker loop hands to a shard runner or a scanner, and what it expects back.

Plain frozen dataclasses of paths and numbers, so a runner (``execution.ShardRunner``) or a
scanner (``shards.scan``) depends on nothing else in ``jobdir`` and a task pickles anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.jobdir.records import ScanRefusal
from data_juicer_elastic.rows.jsonl import NormaliseOptions
from data_juicer_elastic.rows.shard_source import ShardSource, SourceSpan

OUTPUT_FILE: Final = "output.jsonl"  # a shard attempt's canonical output, in its attempt directory


@dataclass(frozen=True)
class ShardTask:
    shard_id: str
    source: ShardSource  # where the shard's rows are, and what they hash to (rows.shard_source)
    attempt_dir: Path  # private to this attempt: write logs, work files and the output here
    generation: int  # the claim generation (fencing token)
    attempt_id: str
    input_rows: int  # rows of the shard, from the manifest
    input_sha256: str  # sha256 of the shard's content, from the manifest (checked again while it is read)
    # What the runner's read_ahead(source) returned while the previous shard ran (claim-ahead,
    # jobdir.claim_ahead), opaque to the loop and read after the file's check; None: read it now.
    read_ahead: Any = field(default=None, compare=False, repr=False)

    @property
    def output_path(self) -> Path:
        """The conventional place for the canonical output (``attempt_dir/output.jsonl``)."""
        return self.attempt_dir / OUTPUT_FILE


@dataclass(frozen=True)
class ShardOutput:
    output_path: Path  # must be inside the task's attempt_dir
    rows: int
    bytes: int | None = None  # optional: checked against the file when given
    sha256: str | None = None  # optional: checked against the file when given
    stats_path: Path | None = None  # optional: per-shard stats summary inside attempt_dir (data_juicer_elastic.stats)
    row_stats_path: Path | None = None  # each output row's stats/meta, one line per output row (jobdir.row_stats)
    errors_path: Path | None = None  # the rows operators failed on, with why (jobdir.row_errors); None: none


@dataclass(frozen=True)
class ScanTask:
    """One shard's scan: read its spans once, check every row, observe the row schema, hash the
    content and (``copy_path``) copy it.  The spans' ``rows`` are not known yet (0)."""

    shard_id: str
    spans: tuple[SourceSpan, ...]
    options: NormaliseOptions
    attempt_dir: Path  # private to this attempt
    copy_path: Path | None = None  # copy_shards: write the content here (inside attempt_dir)
    copy_codec: str = "none"


@dataclass(frozen=True)
class ScanOutput:
    """What a scan found (``jobdir.plan_records.ScanResult`` without the claim's fields)."""

    rows: int
    bytes: int
    sha256: str
    span_rows: list[int]
    schema: list[Any]
    normalise: bool
    longest_line: int
    refusal: ScanRefusal | None = None
    copy_path: Path | None = None
    stored_bytes: int | None = None
    stored_sha256: str | None = None
