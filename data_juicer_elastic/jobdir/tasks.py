"""What the worker loop hands to a shard runner, and what it expects back.

Plain frozen dataclasses of paths and numbers, so a runner (``execution.ShardRunner``)
depends on nothing else in ``jobdir`` and a task pickles anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ShardTask:
    shard_id: str
    shard_path: Path  # the normalised input shard (read-only)
    attempt_dir: Path  # private to this attempt: write logs, work files and the output here
    generation: int  # the claim generation (fencing token)
    attempt_id: str
    input_rows: int  # rows in shard_path, from the manifest
    input_sha256: str  # sha256 of shard_path, from the manifest (already verified)
    # What the runner's read_ahead(shard_path) returned while the previous shard ran (claim-ahead,
    # jobdir.claim_ahead), opaque to the loop and read after the file's check; None: read it now.
    read_ahead: Any = field(default=None, compare=False, repr=False)

    @property
    def output_path(self) -> Path:
        """The conventional place for the canonical output (``attempt_dir/output.jsonl``)."""
        return self.attempt_dir / "output.jsonl"


@dataclass(frozen=True)
class ShardOutput:
    output_path: Path  # must be inside the task's attempt_dir
    rows: int
    bytes: int | None = None  # optional: checked against the file when given
    sha256: str | None = None  # optional: checked against the file when given
    stats_path: Path | None = None  # optional: per-shard stats summary inside attempt_dir (data_juicer_elastic.stats)
    row_stats_path: Path | None = None  # each output row's stats/meta, one line per output row (jobdir.row_stats)
    errors_path: Path | None = None  # the rows operators failed on, with why (jobdir.row_errors); None: none
