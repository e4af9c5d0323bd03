"""A read-only snapshot of a job for humans, ``status --json`` and the executor.

Nothing here writes to the job directory, so status is safe to run anywhere, any
time.  Takeover decisions are never made from a snapshot.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import attempts, fsio, leases
from data_juicer_elastic.jobdir.identity import WorkerIdentity
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import FORMAT_PREFIX, VERSION, AttemptRecord, ShardState, TerminalInfo


@dataclass(frozen=True)
class ShardStatus:
    shard_id: str
    state: ShardState
    generation: int  # latest claim generation (0: never claimed)
    owner_node: str | None  # holder of the latest claim, or the node whose result was accepted
    owner_host: str | None
    owner_pid: int | None
    attempt_id: str | None
    attempts: int  # attempt directories created for this shard
    failures: int  # failure records counting against the retry budget
    last_error: str | None
    input_rows: int
    output_rows: int | None  # rows of the accepted output (DONE only)
    heartbeat_age_secs: float | None  # informational hint, see _hint_stale
    batching: dict[str, Any] | None = None  # adaptive batching summary of the shown attempt (attempt.json)

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

    def to_json(self) -> JsonDict:
        return JsonDict(
            {
                "format": FORMAT_PREFIX + "status",
                "version": VERSION,
                "job_dir": str(self.job_dir),
                "job_id": self.job_id,
                "taken_at": self.taken_at,
                "complete": self.complete,
                "counts": {state.value: n for state, n in self.counts.items()},
                "rows_done": self.rows_done,
                "rows_total": self.rows_total,
                "output_rows": self.output_rows,
                "terminal_failures": [{"shard_id": s, "error": e} for s, e in self.terminal_failures],
                "shards": [s.to_json() for s in self.shards],
            }
        )


def snapshot(
    job_dir: str | Path, ttl_secs: float | None = None, observer: leases.StalenessObserver | None = None
) -> JobSnapshot:
    """Per-shard state of ``job_dir``.

    With an ``observer`` (one that has watched the job for a while, like a worker's)
    RUNNING vs STALE follows the takeover rule.  Without one, ``ttl_secs`` enables a
    *hint*: a claim whose heartbeat file is older than the TTL by its mtime shows as
    STALE.  mtimes come from the server through caches and clocks drift, so this hint
    is for display only; workers never act on it.
    """
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    identity = WorkerIdentity.current()
    shards = [_shard_status(layout, entry, identity, ttl_secs, observer) for entry in manifest.shards]
    return JobSnapshot(layout.root, manifest.job_id, shards, time.time())


def _shard_status(layout, entry, identity, ttl_secs, observer) -> ShardStatus:
    shard = entry.shard_id
    failures = attempts.list_failures(layout, shard)
    last_error = failures[-1].error if failures else None
    n_attempts = len([n for n in fsio.list_names(layout.attempt_root(shard)) if not n.startswith(".")])
    view = leases.read_lease(layout, shard)
    claim = view.claim
    base = dict(
        shard_id=shard,
        generation=view.generation,
        owner_node=claim.node_id if claim else None,
        owner_host=claim.hostname if claim else None,
        owner_pid=claim.pid if claim else None,
        attempt_id=claim.attempt_id if claim else None,
        attempts=n_attempts,
        failures=len(failures),
        last_error=last_error,
        input_rows=entry.rows,
        output_rows=None,
        heartbeat_age_secs=None,
    )
    result, done_error = attempts.read_done(layout, shard)
    if result is not None:
        base.update(owner_node=result.node_id, attempt_id=result.attempt_id, output_rows=result.rows)
        base.update(batching=_batching(layout, shard, result.attempt_id))
        return ShardStatus(state=ShardState.DONE, **base)
    base.update(batching=_batching(layout, shard, claim.attempt_id) if claim else None)
    if done_error is not None:  # a malformed marker never counts as success
        base.update(last_error=f"corrupt done marker: {done_error}")
        return ShardStatus(state=ShardState.FAILED, **base)
    terminal, terminal_error = attempts.read_terminal(layout, shard)
    if terminal is not None or terminal_error is not None:
        base.update(last_error=terminal.last_error if terminal else f"corrupt failed marker: {terminal_error}")
        return ShardStatus(state=ShardState.FAILED, **base)
    if view.generation == 0 or view.ended:
        return ShardStatus(state=ShardState.PENDING, **base)
    age = _heartbeat_age(layout, view)
    base.update(heartbeat_age_secs=age)
    if observer is not None:
        stale = observer.is_stale(view)
    else:
        stale = ttl_secs is not None and age is not None and age > ttl_secs  # display hint only
    if stale or leases.holder_dead_here(view, identity):
        return ShardStatus(state=ShardState.STALE, **base)
    return ShardStatus(state=ShardState.RUNNING, **base)


def _batching(layout: JobLayout, shard: str, attempt_id: str) -> dict[str, Any] | None:
    """The attempt's adaptive-batching summary: from attempt.json once it ended, else its live file."""
    try:
        path = layout.attempt_record(shard, attempt_id)
        data = fsio.read_record(path)
        record = AttemptRecord.parse(data, path) if data is not None else None
    except (OSError, JobDirError):
        record = None
    if record is not None and record.batching is not None:
        return record.batching
    return attempts.read_batching_summary(layout, shard, attempt_id)


def _heartbeat_age(layout: JobLayout, view: leases.LeaseView) -> float | None:
    """Seconds since the heartbeat (or, before the first one, the claim) was written, by mtime."""
    for path in (layout.heartbeat(view.shard_id, view.generation), layout.claim(view.shard_id, view.generation)):
        try:
            return max(0.0, time.time() - fsio.stat(path).st_mtime)
        except OSError:
            continue
    return None


def render_text(snap: JobSnapshot, show_all: bool = False) -> str:
    """Human summary: counts, rows, and the shards worth looking at (all of them with ``show_all``)."""
    counts = ", ".join(f"{state.value} {n}" for state, n in snap.counts.items())
    lines = [
        f"job {snap.job_dir} ({snap.job_id})",
        f"shards: {counts}",
        f"rows: {snap.rows_done}/{snap.rows_total} input rows done, {snap.output_rows} output rows",
        "complete"
        if snap.complete
        else ("FAILED shards need `dj-elastic retry`" if snap.terminal_failures else "incomplete"),
    ]
    batched = [s.batching for s in snap.shards if s.batching]
    if batched:
        lines.append(
            f"adaptive batching: {sum(b.get('ooms', 0) for b in batched)} OOM(s), "
            f"{sum(b.get('retries', 0) for b in batched)} retries in {len(batched)} shard(s); "
            f"{sum(b.get('terminal_ooms', 0) for b in batched)} unrecoverable"
        )
    shown = [s for s in snap.shards if show_all or s.state is not ShardState.DONE]
    for s in shown:
        owner = f" node={s.owner_node}" if s.owner_node else ""
        extra = f" gen={s.generation}{owner} attempts={s.attempts} failures={s.failures}"
        if s.heartbeat_age_secs is not None and s.state in (ShardState.RUNNING, ShardState.STALE):
            extra += f" heartbeat={s.heartbeat_age_secs:.0f}s ago"
        if s.batching:
            finals = ",".join(str(v.get("final_rows")) for v in (s.batching.get("stages") or {}).values())
            extra += f" ooms={s.batching.get('ooms', 0)} final_batch={finals}"
        if s.last_error and s.state is not ShardState.DONE:
            extra += f" last_error={s.last_error!r}"
        lines.append(f"  {s.shard_id} {s.state.value:<7}{extra}")
    return "\n".join(lines)
