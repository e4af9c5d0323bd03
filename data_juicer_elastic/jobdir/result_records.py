"""The records of a shard's attempts and outcome, and of the merge: ``attempt.json``
(:class:`AttemptRecord`), the accepted result ``done/<shard>.json`` (:class:`ShardResult`), the
terminal failure ``failed/<shard>.json`` (:class:`TerminalFailure`), the merge record
(:class:`MergeRecord`) and the index a parts export writes in the export directory (:class:`PartsIndex`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from data_juicer_elastic.jobdir.reasons import AttemptExit
from data_juicer_elastic.jobdir.records import Record


@dataclass(frozen=True)
class AttemptRecord(Record):
    KIND: ClassVar[str] = "attempt"
    shard_id: str
    attempt_id: str
    generation: int
    node_id: str
    hostname: str
    boot_id: str
    pid: int
    started_at: float
    ended_at: float | None = None
    rows: int | None = None
    exit_reason: AttemptExit | None = None
    error: str | None = None
    batching: dict[str, Any] | None = None  # attempt_dir/batching.json, folded in when the attempt ends
    # rows operators failed on that the attempt set aside (quarantine; errors.jsonl), when it published
    quarantined: int | None = None


@dataclass(frozen=True)
class RowStatsFile:
    """An attempt's per-row stats file (jobdir.row_stats): one line per output row."""

    path: str  # relative to the job directory
    bytes: int
    sha256: str


@dataclass(frozen=True)
class RowErrorsFile:
    """An attempt's quarantined rows (jobdir.row_errors): one line per row an operator failed on."""

    path: str  # relative to the job directory
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ShardResult(Record):
    KIND: ClassVar[str] = "result"
    shard_id: str
    attempt_id: str
    generation: int
    node_id: str
    rows: int
    bytes: int
    sha256: str
    output: str  # path of the output file relative to the job directory
    input_rows: int
    input_sha256: str
    published_at: float
    # the output's per-shard stats summary (relative path, sha256 of its bytes); None when the runner wrote none
    stats: str | None = None
    stats_sha256: str | None = None
    row_stats: RowStatsFile | None = None  # jobdir.row_stats; None when the recipe makes no stats or meta
    errors: RowErrorsFile | None = None  # jobdir.row_errors; None when no row was quarantined


@dataclass(frozen=True)
class TerminalFailure(Record):
    KIND: ClassVar[str] = "terminal-failure"
    shard_id: str
    failures: int
    max_retries: int
    last_error: str
    last_attempt_id: str
    generations: list[int]
    failed_at: float
    max_holder_deaths: int | None = None  # the death budget in force (None: unlimited, or an older writer)


@dataclass(frozen=True)
class MergedShard:
    shard_id: str
    attempt_id: str
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class MergeRecord(Record):
    KIND: ClassVar[str] = "merge"
    output_path: str
    rows: int
    bytes: int
    sha256: str
    job_id: str
    content_sha256: str  # of the manifest's input, to tie the output to the job
    shards: list[MergedShard] = field(default_factory=list)
    merged_at: float = 0.0
    # <export>_stats.jsonl (jobdir.row_stats), when the recipe makes per-row stats
    row_stats_path: str | None = None
    row_stats_sha256: str | None = None
    # <export>_errors.jsonl (jobdir.row_errors): the quarantined rows; 0 and None when there were none
    errors_rows: int = 0
    errors_path: str | None = None
    errors_sha256: str | None = None
    # "file": output_path is the merged JSONL and sha256 its hash; "parts": output_path is the
    # export directory and sha256 the hash of its index file (PartsIndex), which names every part
    layout: str = "file"


@dataclass(frozen=True)
class ExportPart:
    """One part of a parts export: a shard's accepted output (and its per-row stats file)."""

    name: str  # part-00003-of-00016.jsonl, in the export directory
    shard_id: str
    attempt_id: str
    rows: int
    bytes: int
    sha256: str
    stats_name: str | None = None  # part-00003-of-00016.stats; None when the recipe makes no per-row stats
    stats_bytes: int | None = None
    stats_sha256: str | None = None
    errors_name: str | None = None  # part-00003-of-00016.errors; None when no row of the shard was quarantined
    errors_rows: int | None = None
    errors_bytes: int | None = None
    errors_sha256: str | None = None


@dataclass(frozen=True)
class PartsIndex(Record):
    """``<export>/_index.dj-elastic``: the parts in input order, written last (its presence means
    complete).  No timestamps: the same job always gives the same bytes."""

    KIND: ClassVar[str] = "parts-index"
    job_id: str
    content_sha256: str  # of the manifest's input, to tie the export to the job
    num_parts: int
    rows: int
    bytes: int
    parts: list[ExportPart] = field(default_factory=list)
