"""A read-only snapshot of a job (per-shard states) for ``status``, the report and the executor.

Nothing here writes, and no takeover is decided from a snapshot.  ``exact=True`` (finalize,
settle: callers that act on it) opens every shard's records by name (NFS listings may be a minute
old); ``exact=False`` (``dj-elastic status``) reads the job summary, or without one lists the job's
directories once and reads only what they name.  What each way reads and leaves None:
``docs/status.md``, "What it reads".
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import attempts, heartbeats, task_queue
from data_juicer_elastic.jobdir.heartbeats import StalenessObserver, looks_stale
from data_juicer_elastic.jobdir.job_summary import JobSummary, LiveClaim, PaceRecord, read_paces, read_summary
from data_juicer_elastic.jobdir.layout import LOG_FILE, JobLayout, parse_shard_id, validate_attempt_id
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import FORMAT_PREFIX, VERSION, AttemptRecord, Manifest, ShardResult
from data_juicer_elastic.jobdir.shard_state import (
    Markers,
    ShardState,
    decide_state,
    is_held,
    read_failed_marker,
    read_markers,
)
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity, attempt_started_at
from data_juicer_elastic.status.scan_phase import scanned_phase, shard_names
from data_juicer_elastic.status.snapshot_types import (
    FROM_SUMMARY,
    JobSnapshot,
    JsonDict,
    NodeTally,
    ShardStatus,
    SummaryNote,
)
from data_juicer_elastic.status.throughput import Summary, summarize


def snapshot_json(snap: JobSnapshot, numbers: Summary | None = None, *, for_orjson: bool = False) -> JsonDict:
    """The snapshot, its counts and the numbers of ``status.throughput`` (``numbers``, when the
    caller computed them): ``dj-elastic status --json`` less the times and runs (``job_view``).
    ``for_orjson``: a shard without progress stays a ``ShardStatus``, which orjson writes as its
    ``to_json()`` (its fields in order, the state's value) at a fraction of the cost."""
    return JsonDict(
        {
            "format": FORMAT_PREFIX + "status",
            "version": VERSION,
            "job_dir": str(snap.job_dir),
            "job_id": snap.job_id,
            "source": snap.source,
            "summary": snap.summary.to_json() if snap.summary is not None else None,
            "taken_at": snap.taken_at,
            "complete": snap.complete,
            "counts": {state.value: n for state, n in snap.counts.items()},
            "rows_done": snap.rows_done,
            "rows_total": snap.rows_total,
            "output_rows": snap.output_rows,
            "scan": snap.scan.to_json() if snap.scan is not None else None,
            "quarantined_rows": snap.quarantined_rows,
            **(numbers or summarize(snap)).to_json(),
            "terminal_failures": [{"shard_id": s, "error": e} for s, e in snap.terminal_failures],
            "shards": [s if for_orjson and s.progress is None else s.to_json() for s in snap.shards],
        }
    )


def snapshot(
    job_dir: str | Path,
    ttl_secs: float | None = None,
    observer: StalenessObserver | None = None,
    *,
    exact: bool = True,
    use_summary: bool = True,
    paces: list[PaceRecord] | None = None,
    now: float | None = None,
    manifest: Manifest | None = None,
) -> JobSnapshot:
    """Per-shard state of ``job_dir``.

    With an ``observer`` (one that has watched the job for a while, like a worker's)
    RUNNING vs STALE follows the takeover rule.  Without one, ``ttl_secs`` enables a
    *hint*: a claim whose heartbeat file is older than the TTL by its mtime shows as
    STALE.  mtimes come from the server through caches and clocks drift, so this hint
    is for display only; workers never act on it.  ``exact``, ``use_summary``: see the module doc;
    ``paces``: the pace records, when the caller read them already (a summary's node tallies);
    ``now``: the reader's wall clock the heartbeats' ages count to (default: now); ``manifest``: the
    job's, when the caller loaded it already (a 10,000-shard manifest takes about 0.3 s to load).
    """
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    if manifest is None:  # a display reads only ids, rows and spans of each shard: light entries
        manifest = load_manifest(layout.root, entries=exact)
    summary = read_summary(layout, manifest) if not exact and use_summary else None
    now = time.time() if now is None else now
    if summary is not None and paces is None:
        paces = read_paces(layout)
    reader = _Reader(layout, manifest, WorkerIdentity.current(), ttl_secs, observer, exact, summary, now, paces)
    shards = reader.shards(manifest.shards)
    heartbeat = manifest.settings.get("heartbeat_interval_secs") or (
        float(manifest.settings.get("lease_ttl_secs") or 0) / 4 or None
    )
    snap = JobSnapshot(layout.root, manifest.job_id, shards, now, heartbeat, scanned_phase(manifest))
    if summary is None:
        return snap
    note = SummaryNote(summary.seq, summary.written_at, reader.summary_live)
    tallies = reconciled_tallies(layout, paces, reader.done, manifest.shards)
    return replace(snap, source=FROM_SUMMARY, summary=note, node_tallies=tallies)


def read_shard(layout: JobLayout, manifest: Manifest, entry, ttl_secs: float | None, now: float) -> ShardStatus:
    """One shard read by name from its records, as ``exact=True`` reads each (the report: an attempt
    claimed since the job summary's round, which the summary's snapshot shows pending)."""
    return _Reader(layout, manifest, WorkerIdentity.current(), ttl_secs, None, True, None, now).shard(entry)


def failure_records(job_dir: str | Path) -> int:
    """Failure records of the job's shards (failed executions and holder deaths): one listing of
    ``failures/`` and the records of each shard it names, none of the shards that never failed."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    return sum(len(task_queue.list_failures(layout, shard)) for shard in sorted(shard_names(layout.failures_dir, "")))


class _Reader:
    def __init__(
        self, layout, manifest, identity, ttl_secs, observer, exact, summary: JobSummary | None, now: float, paces=None
    ):
        self.layout, self.identity, self.ttl_secs, self.observer, self.now = layout, identity, ttl_secs, observer, now
        self.exact, self.summary = exact, summary
        self.attempts_root = str(layout.attempts_dir)
        self.live: dict = {}
        self.live_progress: dict = {}
        if not exact:
            ids = {entry.shard_id for entry in manifest.shards}
            self.done = shard_names(layout.done_dir, ".json", ids)
            self.failed = shard_names(layout.failed_dir, ".json", ids)
            self.with_failures = shard_names(layout.failures_dir, "", ids)
        if summary is not None:  # the summary's live claims stand for claims/; no done marker is read
            self.live = {c.shard_id: c for c in summary.live if c.shard_id not in self.done}
            self.summary_live = len(self.live)
            self.live.update(claims_since(self.live, paces or [], self.done))
            self.claimed = set(self.live)
            # their progress records are all that is read of them, a few at a time (one round trip each)
            self.live_progress = _read_progress(
                layout, [c for c in self.live.values() if c.shard_id not in self.failed]
            )
        elif not exact:
            self.claimed = shard_names(layout.claims_dir, "", ids)
            self.done_bytes = _read_all(layout.done_dir, sorted(self.done), ".json")
        # Adaptive batching summaries cost a read per shard: only where batching can have run.
        recipe = json.dumps(manifest.recipe)
        self.batching_on = "adaptive_batching" in recipe or bool(fsio.list_names(layout.batch_profiles_dir))

    def shards(self, entries) -> list[ShardStatus]:
        """Each shard's status, in manifest order.  From the summary, a shard done or never read
        (most shards of a big job) is built in one loop without the general path's dicts and
        calls, which cost most of a 100,000-shard status."""
        if self.summary is None:
            return [self.shard(entry) for entry in entries]
        read, done, with_failures = self.live_progress.keys() | self.failed, self.done, self.with_failures
        unread, done_state, pending_state = ShardStatus.unread, ShardState.DONE, ShardState.PENDING
        found = []
        for entry in entries:
            shard = entry.shard_id
            if shard in read:
                found.append(self.shard(entry))
            elif shard in done:  # trusted as the summary's writer trusts it
                found.append(unread(shard, done_state, entry.rows, None if shard in with_failures else 0, None))
            else:
                found.append(unread(shard, pending_state, entry.rows, None if shard in with_failures else 0, 0))
        return found

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
        markers = Markers(shard)
        if self.summary is not None:
            # not read from the summary: what a done marker or the claims/ listing would say
            unread = None if shard in self.with_failures else 0
            base.update(generation=None, attempts=None, failures=unread)
            if shard in self.done:  # trusted as the summary's writer trusts it
                return ShardStatus(state=ShardState.DONE, **{**base, "quarantined": None})
            if shard in self.live_progress:  # a live claim as the summary's writer saw it last
                return self._live(shard, self.live[shard], base)
        if self.exact or (self.summary is None and shard in self.done):
            data = None if self.exact else self.done_bytes.get(shard)
            markers = read_markers(self.layout, shard, done_data=data, failed=False)
            state = decide_state(markers)
            if state is ShardState.DONE:
                result = markers.result
                base.update(
                    **self._holder(shard, result.generation, result.node_id, result.attempt_id),
                    output_rows=result.rows,
                    quarantined=result.errors.rows if result.errors is not None else 0,
                    errors_path=result.errors.path if result.errors is not None else None,
                )
                return ShardStatus(state=state, **base)
            if state is ShardState.FAILED:  # a malformed marker never counts as success
                base.update(last_error=markers.last_error)
                return ShardStatus(state=state, **base)
        if not self.exact and shard not in self.claimed and shard not in self.failed:
            return ShardStatus(state=decide_state(markers), **base)  # never claimed: nothing to read
        view = task_queue.read_lease(self.layout, shard)
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
            markers = read_failed_marker(self.layout, markers)
        held = is_held(view)
        if decide_state(markers, held=held) is not ShardState.RUNNING:  # FAILED or PENDING: no lease to judge
            if markers.terminal is not None:
                base.update(log_path=self._log(shard, markers.terminal.last_attempt_id))
            if markers.last_error is not None:
                base.update(last_error=markers.last_error)
            return ShardStatus(state=decide_state(markers, held=held), **base)
        age = heartbeats.heartbeat_age(self.layout, shard, view.generation, self.now)
        record = heartbeats.read_attempt_progress(self.layout, shard, claim.attempt_id)[0] if claim else None
        base.update(heartbeat_age_secs=age, progress=record)
        if self.observer is not None:
            stale = self.observer.is_stale(view)
        else:
            stale = looks_stale(age, self.ttl_secs)  # display hint only
        stale = stale or task_queue.holder_dead_here(view, self.identity) or vouched_stale(self.live.get(shard), view)
        return ShardStatus(state=decide_state(markers, held=True, stale=stale), **base)

    def _live(self, shard: str, claim, base: dict[str, Any]) -> ShardStatus:
        """A running shard from the summary: its claim (generation, attempt, holder) and the writer's
        judgement (stale, and for how long its heartbeat was unchanged), plus its progress record.
        Up to one summary interval old: a claim released since still shows running until the next."""
        base.update(
            **self._holder(shard, claim.generation, claim.node_id, claim.attempt_id),
            owner_pid=claim.pid,
            heartbeat_age_secs=claim.unchanged_secs,
            progress=self.live_progress[shard],
        )
        return ShardStatus(state=decide_state(Markers(shard), held=True, stale=claim.stale), **base)

    def _holder(self, shard: str, generation: int, node: str, attempt_id: str) -> dict[str, Any]:
        """What a shard's status says of the attempt that holds or published it."""
        failures = self._failures(shard)
        return dict(
            generation=generation,
            attempts=generation,
            owner_node=node,
            attempt_id=attempt_id,
            failures=len(failures),
            last_error=failures[-1].error if failures else None,
            batching=self._batching(shard, attempt_id),
            log_path=self._log(shard, attempt_id),
        )

    def _failures(self, shard: str) -> list:
        if not self.exact and shard not in self.with_failures:
            return []
        return task_queue.list_failures(self.layout, shard)

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


def _read_progress(layout: JobLayout, claims: list) -> dict[str, heartbeats.ProgressRecord | None]:
    """``{shard: progress record or None}`` of live claims, read with a few threads."""

    def read(claim) -> heartbeats.ProgressRecord | None:
        return heartbeats.read_attempt_progress(layout, claim.shard_id, claim.attempt_id)[0]

    return dict(zip([c.shard_id for c in claims], fsio.read_many(read, claims), strict=True))


def _read_all(directory: Path, shards: list[str], suffix: str) -> dict[str, bytes]:
    """``{shard: bytes}`` of ``directory/<shard><suffix>`` (``fsio.read_many``).  Unreadable files
    are left out (the caller's own read then reports them)."""
    found = fsio.read_many(_read_quietly, [Path(f"{directory}/{shard}{suffix}") for shard in shards])
    return {shard: data for shard, data in zip(shards, found, strict=True) if data is not None}


def _read_quietly(path: Path) -> bytes | None:
    try:
        return fsio.read_record(path)
    except (OSError, JobDirError):
        return None  # read_done reads it again by itself and reports the error


def claims_since(live: dict[str, LiveClaim], paces: list[PaceRecord], done: set[str]) -> dict[str, LiveClaim]:
    """Claims the workers' pace records hold (each process writes its record as it claims) that are
    newer than the summary's live claims and not done: shards claimed since the summary's round,
    shown running (no staleness verdict yet: no writer has watched them) instead of pending."""
    newer: dict[str, LiveClaim] = {}
    for record in paces:
        for held in record.held if not record.stopped else ():
            known = newer.get(held.shard_id) or live.get(held.shard_id)
            if held.shard_id in done or (known is not None and known.generation >= held.generation):
                continue
            newer[held.shard_id] = LiveClaim(
                held.shard_id, held.generation, held.attempt_id, record.node_id, record.pid, "", None, False
            )
    return newer


def vouched_stale(claim: LiveClaim | None, view: task_queue.LeaseView) -> bool:
    """The summary's writer saw this very heartbeat value unchanged for a TTL (or its holder's pid
    gone on the writer's host), and it is still the value now: the rule a taker follows."""
    return claim is not None and claim.stale and claim.generation == view.generation and claim.token == view.watch_token


def reconciled_tallies(layout: JobLayout, paces: list[PaceRecord], done: set[str], shards: Sequence) -> list[NodeTally]:
    """Accepted results per node for ``status`` from the job summary: the workers' pace records,
    reconciled with the ``done/`` listing, so the per-node rows always add up to the done count.

    A pace record counts its process's accepted results, up to one shard behind while it runs and
    for good when the process was killed between publishing a done marker and recording it.  Such
    a shard is still listed as held by that record (``PaceWriter.finished`` drops the claim and
    counts the result in one change), so it is found without a read per done shard:

    1. every done shard that a pace record still holds, with that record's attempt, is read from
       its done marker (one read each: at most one per worker process) and counted from it;
    2. if the pace records and those markers still do not account for every name in ``done/``
       (a record lost or unreadable, a shard requeued by ``retry`` and done again, a listing behind
       the records), every done marker is read and the tallies are the markers' (what ``--all``
       does): exact, at one read per done shard, only in those cases.
    """
    held = {(h.shard_id, h.attempt_id) for r in paces for h in r.held if h.shard_id in done}
    results = _results(layout, sorted({shard for shard, _ in held}))
    uncounted = [r for r in results if (r.shard_id, r.attempt_id) in held]
    if sum(r.done for r in paces) + len(uncounted) == len(done):
        return _tallies([*_pace_rows(paces), *_result_rows(uncounted, shards)])
    return _tallies(_result_rows(_results(layout, sorted(done)), shards))


def _results(layout: JobLayout, shards: list[str]) -> list[ShardResult]:
    """The accepted results of ``shards`` (read a few at a time); a corrupt or vanished marker is left out."""
    found = fsio.read_many(lambda shard: attempts.read_done(layout, shard)[0], shards)
    return [r for r in found if isinstance(r, ShardResult)]


def _pace_rows(paces: Iterable[PaceRecord]):
    return (
        (r.node_id, r.done, r.rows_out, r.rows_in, r.quarantined, (r.first_secs or 0.0) + r.warm_secs) for r in paces
    )


def _result_rows(results: Iterable[ShardResult], shards: Sequence):
    """Each result's row of the tallies; its input rows the manifest's, found by the id's index (the
    few done markers read look theirs up without a dict of every shard)."""
    for r in results:
        quarantined = r.errors.rows if r.errors is not None else 0
        started = attempt_started_at(r.attempt_id)  # the attempt id's stamp and the marker: one node's clock
        secs = max(0.0, r.published_at - started) if started is not None else 0.0
        try:
            index, count = parse_shard_id(r.shard_id)
        except JobDirError:
            index, count = 0, -1
        rows = shards[index].rows if count == len(shards) else r.input_rows
        yield r.node_id, 1, r.rows, rows, quarantined, secs


def _tallies(rows) -> list[NodeTally]:
    """(node, shards, output rows, input rows, quarantined, attempt secs) rows summed per node."""
    by_node: dict[str, list] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
    for node, *counts in rows:
        by_node[node] = [total + n for total, n in zip(by_node[node], counts, strict=True)]
    return [NodeTally(node, *totals) for node, totals in sorted(by_node.items())]
