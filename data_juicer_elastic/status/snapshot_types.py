"""The shape of a status snapshot: one :class:`ShardStatus` per shard, in a :class:`JobSnapshot`.

Plain data shared by ``job_status`` (which fills it), ``throughput`` (numbers from it) and
``status_text`` (its table); it imports none of them, so they import it without a cycle.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_juicer_elastic.jobdir import progress
from data_juicer_elastic.jobdir.shard_state import ShardState, TerminalInfo
from data_juicer_elastic.sharedfs.identity import attempt_started_at
from data_juicer_elastic.status.scan_phase import ScanPhase


@dataclass(frozen=True)
class ShardStatus:
    shard_id: str
    state: ShardState
    generation: int  # latest claim generation (0: never claimed) == attempts started
    owner_node: str | None  # holder of the latest claim, or the node whose result was accepted
    owner_host: str | None
    owner_pid: int | None
    attempt_id: str | None
    attempts: int  # attempts started (claim generations)
    failures: int  # failure records: failed executions and holder deaths (failures.split_failures)
    last_error: str | None
    input_rows: int
    output_rows: int | None  # rows of the accepted output (DONE only)
    heartbeat_age_secs: float | None  # informational hint, see snapshot()
    batching: dict[str, Any] | None = None  # adaptive batching summary of the shown attempt (attempt.json)
    progress: progress.ProgressRecord | None = None  # live progress of the running attempt
    log_path: str | None = None  # process.log of the shown attempt (the last failed one for FAILED)
    quarantined: int = 0  # rows operators failed on, set aside (DONE only; jobdir.row_errors)
    errors_path: str | None = None  # the accepted attempt's errors.jsonl, relative to the job dir

    def to_json(self) -> dict[str, Any]:
        return {
            "shard_id": self.shard_id,
            "state": self.state.value,
            "generation": self.generation,
            "owner_node": self.owner_node,
            "owner_host": self.owner_host,
            "owner_pid": self.owner_pid,
            "attempt_id": self.attempt_id,
            "attempts": self.attempts,
            "failures": self.failures,
            "last_error": self.last_error,
            "input_rows": self.input_rows,
            "output_rows": self.output_rows,
            "heartbeat_age_secs": self.heartbeat_age_secs,
            "batching": self.batching,
            "progress": _progress_json(self.progress),
            "log_path": self.log_path,
            "quarantined": self.quarantined,
            "errors_path": self.errors_path,
        }


def _progress_json(record: progress.ProgressRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "stage": record.stage,
        "operator": record.operator,
        "rows_read": record.rows_read,
        "rows_written": record.rows_written,
        "rows_total": record.rows_total,
        "elapsed_secs": record.elapsed_secs,
        "updated_at": record.updated_at,
        "seq": record.seq,
        "source": record.source,
    }


class JsonDict(dict):
    """A plain dict whose ``str()`` is its JSON text, so both ``json.dumps(x)`` and ``print(x)`` work."""

    def __str__(self) -> str:
        return json.dumps(self, indent=2, ensure_ascii=False)


@dataclass(frozen=True)
class JobSnapshot:
    job_dir: Path
    job_id: str
    shards: list[ShardStatus]
    taken_at: float
    heartbeat_secs: float | None = None  # the job's heartbeat interval (manifest settings), for lateness
    scan: ScanPhase | None = None  # the scan phase (None: the job was split by a whole-input prepare)

    @property
    def first_shard_secs(self) -> float | None:
        """From the submission (the plan) to the first shard running (the earliest attempt seen)."""
        starts = [t for s in self.shards if (t := attempt_started_at(s.attempt_id)) is not None]
        if self.scan is None or not starts:
            return None
        return max(0.0, min(starts) - self.scan.planned_at)

    @property
    def counts(self) -> dict[ShardState, int]:
        found = Counter(s.state for s in self.shards)
        return {state: found.get(state, 0) for state in ShardState}

    @property
    def complete(self) -> bool:
        return all(s.state is ShardState.DONE for s in self.shards)

    @property
    def terminal_failures(self) -> list[TerminalInfo]:
        return [TerminalInfo(s.shard_id, s.last_error or "") for s in self.shards if s.state is ShardState.FAILED]

    @property
    def rows_total(self) -> int:
        return sum(s.input_rows for s in self.shards)

    @property
    def rows_done(self) -> int:
        return sum(s.input_rows for s in self.shards if s.state is ShardState.DONE)

    @property
    def output_rows(self) -> int:
        return sum(s.output_rows or 0 for s in self.shards)

    @property
    def quarantined_rows(self) -> int:
        return sum(s.quarantined for s in self.shards)
