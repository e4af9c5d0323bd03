"""Where a shard stands, and whether the job is finished: :func:`decide_state` is the only place that
turns what was seen of a shard (its markers, and for a shard they do not settle its lease) into a
:class:`ShardState`; every reader reads what its cost allows (``read_markers``, a ``done/`` listing, a
lease view) and passes it in.  :func:`leaving_outcome` answers from a fresh job summary.  How a job's
scans ended (:func:`scans_verdict`): the input accepted, refused (the first refusal in input order, one
error naming ``file:line``), or a scan's budget spent; every reader of a job without a manifest raises
it once every scan has ended (docs/input-format.md).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple

from data_juicer_elastic.errors import ElasticError, InputChangedError, InputError, JobDirError, ShardFailedError
from data_juicer_elastic.jobdir import attempts, task_queue
from data_juicer_elastic.jobdir.heartbeats import StalenessObserver
from data_juicer_elastic.jobdir.job_summary import SummaryReader
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import JobPlan, Manifest, PlannedShard, ScanResult, ShardResult, TerminalFailure
from data_juicer_elastic.jobdir.task_queue import LeaseView
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity


class ShardState(enum.StrEnum):
    """Where a shard stands.  The only place state names are spelled."""

    PENDING = "pending"  # no live claim: claimable
    RUNNING = "running"  # a claim whose holder is (as far as we can tell) alive
    STALE = "stale"  # a claim whose holder stopped heartbeating: claimable by takeover
    DONE = "done"  # a valid result is published: terminal
    FAILED = "failed"  # retry budget spent, or a corrupt marker: terminal until `retry`


class TerminalInfo(NamedTuple):
    """A terminally failed shard and its last error."""

    shard_id: str
    last_error: str


@dataclass(frozen=True)
class Markers:
    """What was seen of a shard's done and failed markers (those not read are None)."""

    shard_id: str
    result: ShardResult | None = None  # the accepted result
    done_error: str | None = None  # the done marker exists but is corrupt
    terminal: TerminalFailure | None = None
    terminal_error: str | None = None  # the failed marker exists but is corrupt
    known_done: bool = False  # a valid done marker exists, not read here (a listing, a parsed marker)

    @property
    def done(self) -> bool:
        return self.known_done or self.result is not None

    @property
    def corrupt_done(self) -> bool:
        return self.done_error is not None

    @property
    def last_error(self) -> str | None:
        """Why the markers make the shard FAILED, as status and reports show it; None when they do not."""
        if self.done:
            return None
        if self.done_error is not None:
            return f"corrupt done marker: {self.done_error}"
        if self.terminal is not None:
            return self.terminal.last_error
        if self.terminal_error is not None:
            return f"corrupt failed marker: {self.terminal_error}"
        return None

    @property
    def terminal_info(self) -> TerminalInfo | None:
        error = self.last_error
        return None if error is None else TerminalInfo(self.shard_id, error)


def read_markers(layout: JobLayout, shard_id: str, *, done_data: bytes | None = None, failed: bool = True) -> Markers:
    """Open the shard's done marker by name (``done_data``: its bytes, when already read) and,
    when it is absent and ``failed``, its failed marker."""
    result, done_error = attempts.read_done(layout, shard_id, done_data)
    markers = Markers(shard_id, result, done_error)
    return read_failed_marker(layout, markers) if failed else markers


def read_failed_marker(layout: JobLayout, markers: Markers) -> Markers:
    """``markers`` with the failed marker read too (unless the done marker settled the shard)."""
    if markers.done or markers.corrupt_done:
        return markers
    terminal, terminal_error = task_queue.read_terminal(layout, markers.shard_id)
    return replace(markers, terminal=terminal, terminal_error=terminal_error)


def is_held(view: LeaseView) -> bool:
    """The shard's latest generation is claimed and its holder has not given it up."""
    return view.generation > 0 and not view.ended


def decide_state(markers: Markers, *, held: bool = False, stale: bool = False) -> ShardState:
    """The shard's state from its markers and, for a shard they do not settle, its lease:
    ``held`` (a live claim, :func:`is_held`) and ``stale`` (its holder judged gone)."""
    if markers.done:
        return ShardState.DONE
    if markers.last_error is not None:
        return ShardState.FAILED
    if not held:
        return ShardState.PENDING
    return ShardState.STALE if stale else ShardState.RUNNING


def observe_state(
    layout: JobLayout, shard_id: str, observer: StalenessObserver, identity: WorkerIdentity
) -> ShardState:
    """The shard's state now, judged as a worker would take it over: its markers first (no lease
    is read for a settled shard), then its lease, stale by ``observer`` (which must have watched
    the job for a while: ``jobdir.heartbeats``) or by its holder's pid gone on this host."""
    markers = read_markers(layout, shard_id, failed=False)
    state = decide_state(markers)
    if state is ShardState.DONE or state is ShardState.FAILED:
        return state
    view = task_queue.read_lease(layout, shard_id)
    markers = read_failed_marker(layout, markers)
    state = decide_state(markers, held=is_held(view))
    if state is not ShardState.RUNNING:
        return state
    stale = observer.is_stale(view) or task_queue.holder_dead_here(view, identity)
    return decide_state(markers, held=True, stale=stale)


def job_outcome(
    layout: JobLayout, manifest: Manifest, known_done: set[str] | frozenset[str] = frozenset()
) -> tuple[bool, list[TerminalInfo]]:
    """(every shard done, [(shard id, last error) for terminal failures]) from the job dir.
    ``known_done``: shards the caller knows are done (a parsed marker, a ``done/`` listing), not
    opened again; a listed marker that is corrupt is reported by merge, which validates every one."""
    complete = True
    terminal: list[TerminalInfo] = []
    for entry in manifest.shards:
        shard = entry.shard_id
        markers = Markers(shard, known_done=True) if shard in known_done else read_markers(layout, shard)
        if decide_state(markers) is ShardState.DONE:
            continue
        complete = False
        if markers.terminal_info is not None:
            terminal.append(markers.terminal_info)
    return complete, terminal


def leaving_outcome(
    layout: JobLayout, manifest: Manifest, known_done: set[str] | frozenset[str], reader: SummaryReader | None
) -> tuple[bool, list[TerminalInfo]]:
    """:func:`job_outcome` from the summary when ``reader`` has a fresh one: complete when it shows
    every shard done (a ``done/`` listing, trusted as a worker's own listing is), and the terminal
    failures it names, each read by name.  A summary a few seconds old may say "not complete" for
    a job that just completed: callers then wait (settle), which reads the summary again."""
    view = reader.view() if reader is not None else None
    if view is None:
        return job_outcome(layout, manifest, known_done)
    return (True, []) if view.all_done else (False, terminal_infos(layout, sorted(view.failed)))


def terminal_infos(layout: JobLayout, shard_ids: Iterable[str]) -> list[TerminalInfo]:
    """The terminal failures among ``shard_ids`` (names from ``failed/`` or the summary: hints),
    each failed marker read by name; a name that is no shard id is skipped."""
    found = []
    for shard in shard_ids:
        try:
            markers = read_failed_marker(layout, Markers(shard))
        except ElasticError:  # a foreign file name in failed/
            continue
        if decide_state(markers) is ShardState.FAILED:
            found.append(markers.terminal_info)
    return found


def scans_verdict(layout: JobLayout, plan: JobPlan) -> tuple[ElasticError | None, dict[str, ScanResult]]:
    """Once every shard's scan has ended: (the job's error, {}) when a scan failed terminally or
    refused the input, else (None, every accepted scan)."""
    failed = terminal_infos(layout.scans, plan.shard_ids)
    if failed:
        shown = "; ".join(f"{shard}: {why}" for shard, why in failed[:3])
        error = ShardFailedError(
            f"the scan of {len(failed)} shard(s) failed terminally: {shown}",
            where=str(layout.scans.failed_dir),
            hint="fix the cause (see the scan attempts' logs), then prepare a new job_dir",
        )
        return error, {}
    results = read_scans(layout, plan)
    refused = refusal_error(plan, results)
    return (refused, {}) if refused is not None else (None, results)


def ended_scans_error(layout: JobLayout, plan: JobPlan) -> ElasticError | None:
    """The error that ended the scans of a job without a manifest, for a reader of the job (worded
    as what happened to the job); None while any shard's scan has not ended (more workers scan it),
    or when none refused the input.  One listing each of ``scans/done`` and ``scans/failed`` decides
    whether to read further."""
    listed = {*fsio.list_names(layout.scans.done_dir), *fsio.list_names(layout.scans.failed_dir)}
    if any(f"{shard}.json" not in listed for shard in plan.shard_ids):
        return None
    error, _ = scans_verdict(layout, plan)
    if error is None or isinstance(error, ShardFailedError):
        return error
    hint = f"{error.hint}; then" if error.hint else "fix the input, then"
    return type(error)(
        f"the job's scan refused its input: {error.message}",
        where=error.where,
        hint=f"{hint} run the job again with a new job_dir, or remove {layout.root} first: workers started on "
        "this one only refuse it again",
    )


def read_scans(layout: JobLayout, plan: JobPlan) -> dict[str, ScanResult]:
    """Every shard's accepted scan, read by name (one read each); JobDirError naming the first
    marker that is corrupt (checksum, format, a foreign shard), missing, or not of its planned shard."""
    results = {}
    for entry in plan.shards:
        where = str(layout.scans.done(entry.shard_id))
        result, error = attempts.read_done(layout.scans, entry.shard_id)
        if error is not None:
            raise JobDirError(
                f"corrupt scan record: {error}",
                where=where,
                hint="delete that record to scan the shard again (dj-elastic worker), or prepare a new job_dir",
            )
        if result is None:
            raise JobDirError(f"shard {entry.shard_id} is not scanned yet", where=where)
        assert isinstance(result, ScanResult)
        _check_against_plan(plan, entry, result, where)
        results[entry.shard_id] = result
    return results


def _check_against_plan(plan: JobPlan, entry: PlannedShard, result: ScanResult, where: str) -> None:
    if result.refusal is not None:
        return  # a refusal stops at its span; the job is refused with it
    if len(result.span_rows) != len(entry.spans) or sum(result.span_rows) != result.rows:
        raise JobDirError(f"scan record of {entry.shard_id} does not match the plan's spans", where=where)
    plain = all(plan.inputs[s.input].codec == "none" for s in entry.spans)
    if plain and result.bytes < entry.bytes:
        raise JobDirError(f"scan record of {entry.shard_id} holds fewer bytes than its spans", where=where)
    if plan.copy_shards and result.copy is None:
        raise JobDirError(f"scan record of {entry.shard_id} names no copy, but the job copies shards", where=where)


def refusal_error(plan: JobPlan, results: dict[str, ScanResult]) -> ElasticError | None:
    """The job's input error: the first refusal in input order, as one error naming ``file:line``."""
    rows_before: dict[int, int] = {}  # rows of each input file in the spans before this one
    for entry in plan.shards:
        result = results[entry.shard_id]
        for number, span in enumerate(entry.spans):
            refusal = result.refusal
            if refusal is not None and refusal.span == number:
                path = plan.inputs[span.input].path
                where = path if refusal.line is None else f"{path}:{rows_before.get(span.input, 0) + refusal.line}"
                kind = InputChangedError if refusal.error_type == InputChangedError.__name__ else InputError
                return kind(refusal.message, where=where, hint=refusal.hint)
            rows_before[span.input] = rows_before.get(span.input, 0) + result.span_rows[number]
    return None
