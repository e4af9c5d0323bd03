"""A read-only snapshot of a job for humans, ``status --json`` and the executor.

Nothing here writes to the job directory, so status is safe to run anywhere, any
time.  Takeover decisions are never made from a snapshot.

Two ways to find each shard's state (``exact``):

* ``exact=True`` (library callers that act on the result: finalize, settle) opens
  every shard's done / failed / lease records by name, as the leases design asks
  (directory listings are cached on NFS for up to a minute).
* ``exact=False`` (``dj-elastic status``) lists ``done/``, ``failed/``,
  ``claims/`` and ``failures/`` once and reads only what the listings say
  exists: a never-claimed shard costs no file operation, a done one one read.
  A listing up to a minute old can show a just-finished shard as running: fine
  for a display, and 10,000 shards cost a few thousand reads instead of ~100,000.

Throughput, ETA, per-node rates and stragglers are computed from the snapshot in
``status/throughput.py``; the JSON schema is documented in ``docs/status.md``.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import attempts, leases, progress
from data_juicer_elastic.jobdir.layout import LOG_FILE, JobLayout, parse_shard_id, validate_attempt_id
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import FORMAT_PREFIX, VERSION, AttemptRecord, ShardState, TerminalInfo
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

READ_THREADS: Final = 8


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
    failures: int  # failure records: failed executions and holder deaths (attempts.split_failures)
    last_error: str | None
    input_rows: int
    output_rows: int | None  # rows of the accepted output (DONE only)
    heartbeat_age_secs: float | None  # informational hint, see snapshot()
    batching: dict[str, Any] | None = None  # adaptive batching summary of the shown attempt (attempt.json)
    progress: progress.ProgressRecord | None = None  # live progress of the running attempt
    log_path: str | None = None  # process.log of the shown attempt (the last failed one for FAILED)

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
        from data_juicer_elastic.status.throughput import summarize

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
                **summarize(self).to_json(),
                "terminal_failures": [{"shard_id": s, "error": e} for s, e in self.terminal_failures],
                "shards": [s.to_json() for s in self.shards],
            }
        )


def snapshot(
    job_dir: str | Path,
    ttl_secs: float | None = None,
    observer: leases.StalenessObserver | None = None,
    *,
    exact: bool = True,
) -> JobSnapshot:
    """Per-shard state of ``job_dir``.

    With an ``observer`` (one that has watched the job for a while, like a worker's)
    RUNNING vs STALE follows the takeover rule.  Without one, ``ttl_secs`` enables a
    *hint*: a claim whose heartbeat file is older than the TTL by its mtime shows as
    STALE.  mtimes come from the server through caches and clocks drift, so this hint
    is for display only; workers never act on it.  ``exact``: see the module doc.
    """
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    reader = _Reader(layout, manifest, WorkerIdentity.current(), ttl_secs, observer, exact)
    shards = [reader.shard(entry) for entry in manifest.shards]
    heartbeat = manifest.settings.get("heartbeat_interval_secs") or (
        float(manifest.settings.get("lease_ttl_secs") or 0) / 4 or None
    )
    return JobSnapshot(layout.root, manifest.job_id, shards, time.time(), heartbeat)


class _Reader:
    def __init__(self, layout, manifest, identity, ttl_secs, observer, exact):
        self.layout, self.identity, self.ttl_secs, self.observer = layout, identity, ttl_secs, observer
        self.exact = exact
        self.attempts_root = str(layout.attempts_dir)
        if not exact:
            self.done = _shard_names(layout.done_dir, ".json")
            self.failed = _shard_names(layout.failed_dir, ".json")
            self.claimed = _shard_names(layout.claims_dir, "")
            self.with_failures = _shard_names(layout.failures_dir, "")
            self.done_bytes = _read_all(layout.done_dir, sorted(self.done), ".json")
        # Adaptive batching summaries cost a read per shard: only where batching can have run.
        recipe = json.dumps(manifest.recipe)
        self.batching_on = "adaptive_batching" in recipe or bool(fsio.list_names(layout.batch_profiles_dir))

    def shard(self, entry) -> ShardStatus:
        shard = entry.shard_id
        base: dict[str, Any] = dict(
            shard_id=shard,
            generation=0,
            owner_node=None,
            owner_host=None,
            owner_pid=None,
            attempt_id=None,
            attempts=0,
            failures=0,
            last_error=None,
            input_rows=entry.rows,
            output_rows=None,
            heartbeat_age_secs=None,
        )
        if self.exact or shard in self.done:
            data = None if self.exact else self.done_bytes.get(shard)
            result, done_error = attempts.read_done(self.layout, shard, data)
            if result is not None:
                failures = self._failures(shard)
                base.update(
                    generation=result.generation,
                    attempts=result.generation,
                    owner_node=result.node_id,
                    attempt_id=result.attempt_id,
                    output_rows=result.rows,
                    failures=len(failures),
                    last_error=failures[-1].error if failures else None,
                    batching=self._batching(shard, result.attempt_id),
                    log_path=self._log(shard, result.attempt_id),
                )
                return ShardStatus(state=ShardState.DONE, **base)
            if done_error is not None:  # a malformed marker never counts as success
                base.update(last_error=f"corrupt done marker: {done_error}")
                return ShardStatus(state=ShardState.FAILED, **base)
        if not self.exact and shard not in self.claimed and shard not in self.failed:
            return ShardStatus(state=ShardState.PENDING, **base)  # never claimed: nothing to read
        view = leases.read_lease(self.layout, shard)
        claim = view.claim
        failures = self._failures(shard)
        base.update(
            generation=view.generation,
            attempts=view.generation,
            owner_node=claim.node_id if claim else None,
            owner_host=claim.hostname if claim else None,
            owner_pid=claim.pid if claim else None,
            attempt_id=claim.attempt_id if claim else None,
            failures=len(failures),
            last_error=failures[-1].error if failures else None,
            batching=self._batching(shard, claim.attempt_id) if claim else None,
            log_path=self._log(shard, claim.attempt_id) if claim else None,
        )
        if self.exact or shard in self.failed:
            terminal, terminal_error = attempts.read_terminal(self.layout, shard)
            if terminal is not None or terminal_error is not None:
                if terminal is not None:
                    base.update(last_error=terminal.last_error, log_path=self._log(shard, terminal.last_attempt_id))
                else:
                    base.update(last_error=f"corrupt failed marker: {terminal_error}")
                return ShardStatus(state=ShardState.FAILED, **base)
        if view.generation == 0 or view.ended:
            return ShardStatus(state=ShardState.PENDING, **base)
        age = _heartbeat_age(self.layout, view)
        record = progress.read_progress(self.layout, shard, claim.attempt_id)[0] if claim else None
        base.update(heartbeat_age_secs=age, progress=record)
        if self.observer is not None:
            stale = self.observer.is_stale(view)
        else:
            stale = self.ttl_secs is not None and age is not None and age > self.ttl_secs  # display hint only
        if stale or leases.holder_dead_here(view, self.identity):
            return ShardStatus(state=ShardState.STALE, **base)
        return ShardStatus(state=ShardState.RUNNING, **base)

    def _failures(self, shard: str) -> list:
        if not self.exact and shard not in self.with_failures:
            return []
        return attempts.list_failures(self.layout, shard)

    def _batching(self, shard: str, attempt_id: str) -> dict[str, Any] | None:
        """The attempt's adaptive-batching summary: from attempt.json once it ended, else its live file."""
        if not self.batching_on:
            return None
        try:
            path = self.layout.attempt_record(shard, attempt_id)
            data = fsio.read_record(path)
            record = AttemptRecord.parse(data, path) if data is not None else None
        except (OSError, JobDirError):
            record = None
        if record is not None and record.batching is not None:
            return record.batching
        try:
            return attempts.read_batching_summary(self.layout, shard, attempt_id)
        except JobDirError:  # an attempt id from a record that would leave the job directory
            return None

    def _log(self, shard: str, attempt_id: str) -> str | None:
        # A string join, not JobLayout.attempt_dir: 10,000 Path objects cost ~0.3 s.
        try:
            validate_attempt_id(attempt_id)  # from a record: never let it leave the job directory
        except JobDirError:  # "unknown" holder of a corrupt claim
            return None
        return f"{self.attempts_root}/{shard}/{attempt_id}/{LOG_FILE}"


def _shard_names(directory: Path, suffix: str) -> set[str]:
    """Shard ids named in a directory listing (``<shard><suffix>``); anything else is ignored."""
    found = set()
    for name in fsio.list_names(directory):
        if suffix and not name.endswith(suffix):
            continue
        shard = name[: len(name) - len(suffix)] if suffix else name
        try:
            parse_shard_id(shard)
        except JobDirError:
            continue
        found.add(shard)
    return found


def _read_all(directory: Path, shards: list[str], suffix: str) -> dict[str, bytes]:
    """``{shard: bytes}`` of ``directory/<shard><suffix>``, read with a few threads: on NFS each
    open is a round trip to the server, and threads overlap them (reads release the GIL).
    Unreadable files are left out (the caller's own read then reports them)."""
    paths = [Path(f"{directory}/{shard}{suffix}") for shard in shards]
    with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
        found = pool.map(_read_quietly, paths, chunksize=256)
        return {shard: data for shard, data in zip(shards, found, strict=True) if data is not None}


def _read_quietly(path: Path) -> bytes | None:
    try:
        return fsio.read_record(path)
    except (OSError, JobDirError):
        return None  # read_done reads it again by itself and reports the error


def _heartbeat_age(layout: JobLayout, view: leases.LeaseView) -> float | None:
    """Seconds since the heartbeat (or, before the first one, the claim) was written, by mtime."""
    for path in (layout.heartbeat(view.shard_id, view.generation), layout.claim(view.shard_id, view.generation)):
        try:
            return max(0.0, time.time() - fsio.stat(path).st_mtime)
        except OSError:
            continue
    return None


def render_text(snap: JobSnapshot, show_all: bool = False) -> str:
    """Human summary: counts, rows, rates, nodes, stragglers, failures, and the shards worth a look."""
    from data_juicer_elastic.status.status_text import render_text as render

    return render(snap, show_all=show_all)
