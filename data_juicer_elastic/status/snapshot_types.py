"""The shape of a status snapshot: one :class:`ShardStatus` per shard, in a :class:`JobSnapshot`,
read from the job directory or from the job summary (:attr:`JobSnapshot.source`: done shards are
then known from a listing, nothing of them read).  A field the source did not read is None
(``docs/status.md`` lists which)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.jobdir import heartbeats
from data_juicer_elastic.jobdir.shard_state import ShardState, TerminalInfo
from data_juicer_elastic.status.scan_phase import ScanPhase

FROM_JOB_DIR: Final = "job directory"  # JobSnapshot.source: the listings and the records they name
FROM_SUMMARY: Final = "summary"  # the job summary, the listings of done/ and failed/, the live claims' records


@dataclass(frozen=True)
class ShardStatus:
    shard_id: str
    state: ShardState
    generation: int | None  # latest claim generation (0: never claimed) == attempts started; None: not read
    owner_node: str | None  # holder of the latest claim, or the node whose result was accepted
    owner_host: str | None
    owner_pid: int | None
    attempt_id: str | None
    attempts: int | None  # attempts started (claim generations); None: not read
    failures: int | None  # failure records (task_queue.split_failures); None: at least one, not read
    last_error: str | None
    input_rows: int
    output_rows: int | None  # rows of the accepted output (DONE only)
    heartbeat_age_secs: float | None  # informational hint, see snapshot()
    batching: dict[str, Any] | None = None  # adaptive batching summary of the shown attempt (attempt.json)
    progress: heartbeats.ProgressRecord | None = None  # live progress of the running attempt
    log_path: str | None = None  # process.log of the shown attempt (the last failed one for FAILED)
    quarantined: int | None = 0  # rows operators failed on, set aside (DONE only; jobdir.exports); None: not read
    errors_path: str | None = None  # the accepted attempt's errors.jsonl, relative to the job dir

    @classmethod
    def unread(
        cls, shard_id: str, state: ShardState, input_rows: int, failures: int | None, quarantined: int | None
    ) -> ShardStatus:
        """A shard of which nothing was read (done or pending, from the job summary), equal to the
        one ``__init__`` builds, fields in the same order (orjson writes them from ``__dict__``),
        at half the cost: the frozen ``__init__``'s setattr per field is most of a 100,000-shard
        snapshot."""
        status = object.__new__(cls)
        status.__dict__.update(
            shard_id=shard_id, state=state, generation=None, owner_node=None, owner_host=None, owner_pid=None,
            attempt_id=None, attempts=None, failures=failures, last_error=None, input_rows=input_rows,
            output_rows=None, heartbeat_age_secs=None, batching=None, progress=None, log_path=None,
            quarantined=quarantined, errors_path=None,
        )  # fmt: skip
        return status

    def to_json(self) -> dict[str, Any]:
        # the names once per class (dataclasses.fields per call was most of a 100,000-shard --json)
        fields_ = {name: getattr(self, name) for name in _shard_fields()}
        return {**fields_, "state": self.state.value, "progress": _progress_json(self.progress)}


@functools.cache
def _shard_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(ShardStatus))


_PROGRESS_KEYS: Final = (
    "stage", "operator", "rows_read", "rows_written", "rows_total", "elapsed_secs", "updated_at", "seq", "source"
)  # fmt: skip


def _progress_json(record: heartbeats.ProgressRecord | None) -> dict[str, Any] | None:
    return None if record is None else {key: getattr(record, key) for key in _PROGRESS_KEYS}


class JsonDict(dict):
    """A plain dict whose ``str()`` is its JSON text, so both ``json.dumps(x)`` and ``print(x)`` work."""

    def __str__(self) -> str:
        return json.dumps(self, indent=2, ensure_ascii=False)


@dataclass(frozen=True)
class SummaryNote:
    """The job summary a snapshot was read with: which one, and when its writer wrote it."""

    seq: str
    written_at: float  # the writer's wall clock
    live_claims: int  # live claims it lists (each one's lease was read)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "written_at": self.written_at, "live_claims": self.live_claims}


@dataclass(frozen=True)
class NodeTally:
    """A node's accepted results as its worker processes count them (their pace records)."""

    node_id: str
    shards_done: int
    output_rows: int
    rows_done: int = 0  # input rows of those results
    quarantined: int = 0
    attempt_secs: float = 0.0  # the durations of those attempts (a first one's includes its runtime's start)

    @property
    def attempt_rows_per_sec(self) -> float | None:
        """Rows/s of one of the node's attempts, over its accepted ones: a running attempt's rate
        until it reports rows of its own (``status.throughput.rate``)."""
        return self.rows_done / self.attempt_secs if self.rows_done and self.attempt_secs > 0 else None


# A snapshot's totals are each a pass over every shard, asked for by the text, the JSON and the
# throughput numbers alike: cached on the instance (functools.cached_property writes its __dict__,
# which a frozen dataclass allows; a snapshot never changes once built).
@dataclass(frozen=True)
class JobSnapshot:
    job_dir: Path
    job_id: str
    shards: list[ShardStatus]
    taken_at: float
    heartbeat_secs: float | None = None  # the job's heartbeat interval (manifest settings), for lateness
    scan: ScanPhase | None = None  # the scan phase (None: the job was split by a whole-input prepare)

    source: str = FROM_JOB_DIR
    summary: SummaryNote | None = None  # the job summary the snapshot was read with (FROM_SUMMARY)
    node_tallies: list[NodeTally] | None = None  # accepted results per node (FROM_SUMMARY: pace records)

    @property
    def from_summary(self) -> bool:
        return self.source == FROM_SUMMARY

    @functools.cached_property
    def by_state(self) -> dict[ShardState, list[ShardStatus]]:
        """The shards in each state, each list in manifest order (one pass for every total)."""
        groups: dict[ShardState, list[ShardStatus]] = {state: [] for state in ShardState}
        for s in self.shards:
            groups[s.state].append(s)
        return groups

    @functools.cached_property
    def counts(self) -> dict[ShardState, int]:
        return {state: len(shards) for state, shards in self.by_state.items()}

    @functools.cached_property
    def complete(self) -> bool:
        return len(self.by_state[ShardState.DONE]) == len(self.shards)

    @functools.cached_property
    def terminal_failures(self) -> list[TerminalInfo]:
        return [TerminalInfo(s.shard_id, s.last_error or "") for s in self.by_state[ShardState.FAILED]]

    @functools.cached_property
    def rows_total(self) -> int:
        return sum(s.input_rows for s in self.shards)

    @functools.cached_property
    def rows_done(self) -> int:
        return sum(s.input_rows for s in self.by_state[ShardState.DONE])

    @functools.cached_property
    def output_rows(self) -> int:
        if self.node_tallies is not None:
            return sum(t.output_rows for t in self.node_tallies)
        return sum(s.output_rows or 0 for s in self.shards)

    @functools.cached_property
    def quarantined_rows(self) -> int | None:
        if self.from_summary:  # the workers' pace records count them (no done marker is read)
            return None if self.node_tallies is None else sum(t.quarantined for t in self.node_tallies)
        return sum(s.quarantined or 0 for s in self.shards)
