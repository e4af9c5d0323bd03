"""One instance's way through a run: prepare -> work (scan, run) -> settle -> finalize -> outcome, with
the steps that touch Ray or Data-Juicer passed in (:class:`Phases`), so it runs and is tested without
either (docs/architecture.md, "Coordination protocol").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from data_juicer_elastic.coordination.run import (
    FINALIZE,
    PREPARE,
    WORK,
    Outcome,
    PrepareResult,
    RunCoordinator,
    raise_outcome,
)
from data_juicer_elastic.errors import (
    ElasticError,
    InputChangedError,
    InputError,
    ParticipationError,
    ShardFailedError,
    preview,
)
from data_juicer_elastic.jobdir import heartbeats, job_summary
from data_juicer_elastic.jobdir.attempts import marker_ids
from data_juicer_elastic.jobdir.job_summary import reader_for
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest, load_plan
from data_juicer_elastic.jobdir.records import JobPlan, Manifest
from data_juicer_elastic.jobdir.shard_state import (
    ShardState,
    TerminalInfo,
    decide_state,
    leaving_outcome,
    observe_state,
    read_markers,
    terminal_infos,
)
from data_juicer_elastic.jobdir.worker import WorkerSummary


@dataclass(frozen=True)
class Phases:
    prepare: Callable[[], tuple[JobPlan, bool]]
    """Leader: validate and plan (idempotent); (plan, created)."""
    check_prepared: Callable[[JobPlan], None]
    """Everyone else: raise if this instance's own request differs from the planned job."""
    work: Callable[[threading.Event, int | None], WorkerSummary]
    """Scan (while the job is not scanned), then claim and run shards until nothing is claimable,
    the event is set, or the share is done."""
    finalize: Callable[[], dict[str, Any]]
    """Leader: merge every shard result; the details every instance reports."""


def run_coordinated(
    c: RunCoordinator,
    phases: Phases,
    *,
    wait_timeout_secs: float,
    strict: StrictPolicy | None = None,
    user_cap: bool = False,
) -> Outcome | None:
    """The run's ok outcome, or None when this instance left early at its ``max_shards``; raises the
    run's error (ElasticError, exit 2) when it was aborted.  The coordinator's TTL, poll interval,
    clock and sleep pace every wait."""
    _prepare(c, phases)
    existing = c.outcome()
    if existing is not None:  # a late joiner: the run has ended already; redo nothing
        logger.info(f"run {c.run.value} has already ended; reporting its outcome")
        return _report(existing)

    stop = threading.Event()
    with AbortWatcher(c, stop) as watcher:
        try:
            summary = phases.work(stop, strict.share_per_slot if strict else None)
        except (InputError, InputChangedError) as exc:
            # the scans refused the job's input: the same verdict on every instance, recorded once
            raise_outcome(c.abort(WORK, exc))
        watcher.check()
    c.raise_if_aborted()
    if summary.terminal_failures:
        raise_outcome(c.abort(WORK, shard_failed_error(summary.terminal_failures, c.layout.root)))
    if summary.stop_reason == "max_shards" and user_cap and not summary.complete:
        # elastic.max_shards: this instance's cap; the others (or `dj-elastic merge`) finish.
        logger.info("reached elastic.max_shards; leaving the rest of the run to the other instances")
        return None
    manifest = load_manifest(c.layout.root)  # composed by the scans before any shard ran
    # Done is terminal: a worker that saw every shard done need not read every marker again, and
    # one that did not asks the job summary (every shard only when there is no fresh summary).
    complete = summary.complete or leaving_outcome(c.layout, manifest, frozenset(), reader_for(c.layout, manifest))[0]
    if not complete:
        wait_settled(c, manifest, wait_timeout_secs=wait_timeout_secs, strict=strict)
    return _report(_finalize(c, phases, manifest, strict))


def _prepare(c: RunCoordinator, phases: Phases) -> JobPlan:
    won, leader = c.elect(PREPARE)
    if won:
        with c.holding(PREPARE):
            try:
                plan, created = phases.prepare()
            except Exception as exc:
                _log_unexpected(exc, PREPARE)
                raise_outcome(c.abort(PREPARE, exc))
            result = PrepareResult(
                c.run.value, c.instance_id, plan.job_id, created, plan.num_shards, plan.recipe_hash, time.time()
            )
            c.publish_prepare_result(result)
        return plan
    result = c.await_phase(PREPARE, leader, c.prepare_result)
    plan = load_plan(c.layout.root)
    if plan.job_id != result.job_id:  # pragma: no cover - a job dir replaced under a running run
        raise ElasticError("the job directory was replaced during the run", where=str(c.layout.root))
    logger.info(f"job planned by {leader.describe()}: {plan.num_shards} shards")
    phases.check_prepared(plan)
    return plan


def _finalize(c: RunCoordinator, phases: Phases, manifest: Manifest, strict: StrictPolicy | None) -> Outcome:
    won, leader = c.elect(FINALIZE)
    if not won:
        return c.await_phase(FINALIZE, leader, c.outcome)
    with c.holding(FINALIZE):
        try:
            c.raise_if_aborted()
            details: dict[str, Any] = {}
            if strict is not None:
                details["nodes"] = check_participation(c.layout, manifest, strict)
            details.update(phases.finalize())
        except Exception as exc:
            _log_unexpected(exc, FINALIZE)
            raise_outcome(c.abort(FINALIZE, exc))
        return c.finalized(details)


def _report(outcome: Outcome) -> Outcome:
    if not outcome.ok:
        raise_outcome(outcome)
    return outcome


def _log_unexpected(exc: Exception, phase: str) -> None:
    if not isinstance(exc, ElasticError):
        logger.opt(exception=exc).error(f"unexpected error during {phase}")


def shard_failed_error(terminal: list[TerminalInfo], job_dir: Path) -> ShardFailedError:
    """The one message every instance reports for terminally failed shards."""
    shard_id, last_error = terminal[0]
    return ShardFailedError(
        f"{len(terminal)} shard(s) failed terminally; first: {shard_id}: {last_error}",
        where=str(job_dir),
        hint="inspect the attempt logs shown by `dj-elastic status --job-dir ...`, fix the cause, then "
        "`dj-elastic retry --all-failed` and run again",
    )


def terminal_failures(layout: JobLayout, *, from_summary: bool = False) -> list[TerminalInfo]:
    """Terminally failed shards, found through the ``failed/`` listing (a hint) or, with
    ``from_summary`` while this process has a fresh job summary, through the summary (a poll
    that may lag a summary interval), and read by name."""
    view = job_summary.view_of(layout) if from_summary else None
    if view is not None:
        return terminal_infos(layout, sorted(view.failed))
    return terminal_infos(layout, marker_ids(layout.failed_dir))


class AbortWatcher:
    """Context manager: a daemon thread that turns aborts into ``stop_event``."""

    def __init__(self, coordinator: RunCoordinator, stop_event: threading.Event):
        self.c, self.stop_event, self.interval = coordinator, stop_event, coordinator.poll_secs
        self._thread = heartbeats.PeriodicThread(self.interval, self._tick, "abort-watcher", join_secs=5)

    def check(self) -> bool:
        """One look; True when the run is aborted (and the stop event is set)."""
        outcome = self.c.outcome()
        if outcome is None:
            failed = terminal_failures(self.c.layout, from_summary=True)  # every poll of every instance
            if failed:
                outcome = self.c.abort(WORK, shard_failed_error(failed, self.c.layout.root))
        if outcome is not None and not outcome.ok:
            if not self.stop_event.is_set():
                logger.warning(f"run aborted: {outcome.message}; this instance stops claiming shards")
            self.stop_event.set()
            return True
        return False

    def _tick(self) -> bool:
        """Whether to keep watching."""
        try:
            return not self.check()
        except (OSError, ElasticError) as exc:  # a transient read error must not kill the watcher
            logger.warning(f"abort watcher: {exc}")
            return True

    def __enter__(self) -> AbortWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._thread.stop()


@dataclass(frozen=True)
class StrictPolicy:
    """Strict participation: ``nodes`` distinct nodes, each completing ``share`` shards per slot."""

    nodes: int
    share_per_slot: int
    slots: int


def wait_settled(
    coordinator: RunCoordinator,
    manifest: Manifest,
    *,
    wait_timeout_secs: float,
    strict: StrictPolicy | None,
) -> None:
    """Return once every shard is done; raise the run's failure otherwise (never claims)."""
    layout, identity, clock = coordinator.layout, coordinator.identity, coordinator.clock
    observer = heartbeats.StalenessObserver(coordinator.ttl_secs, clock)
    unclaimed_since: float | None = None
    logger.info("waiting for the other instances to finish the remaining shards")
    reader = reader_for(layout, manifest, ttl_secs=coordinator.ttl_secs, clock=clock)
    while True:
        coordinator.raise_if_aborted()
        view = reader.view()
        # the job summary when there is a fresh one (O(terminal failures) reads), else every shard
        complete, terminal = leaving_outcome(layout, manifest, frozenset(), reader if view is not None else None)
        if terminal:
            raise_outcome(coordinator.abort(WORK, shard_failed_error(terminal, layout.root)))
        if complete:
            return
        if view is not None:
            unclaimed = view.unclaimed()
        else:
            unclaimed = [
                entry.shard_id
                for entry in manifest.shards
                if observe_state(layout, entry.shard_id, observer, identity) in (ShardState.PENDING, ShardState.STALE)
            ]
        now = clock()
        if not unclaimed:
            unclaimed_since = None
        elif unclaimed_since is None:
            unclaimed_since = now
        elif now - unclaimed_since >= wait_timeout_secs:
            raise_outcome(coordinator.abort(WORK, _nobody_claims(coordinator, unclaimed, wait_timeout_secs, strict)))
        coordinator.sleep(coordinator.poll_secs)


def _nobody_claims(
    coordinator: RunCoordinator, unclaimed: list[str], timeout: float, strict: StrictPolicy | None
) -> ParticipationError:
    joined = sorted({p.instance.node_id for p in coordinator.participants()})
    shown = preview(unclaimed)
    if strict is not None:
        missing = max(0, strict.nodes - len(joined))
        return ParticipationError(
            f"strict mode (require_all_nodes, nodes={strict.nodes}): {len(unclaimed)} shard(s) ({shown}) had no "
            f"claimant for {timeout:g}s; each node may complete {strict.share_per_slot * strict.slots} shard(s) "
            f"and only {len(joined)} of {strict.nodes} node(s) joined run {coordinator.run.value} "
            f"({', '.join(joined)}); {missing} node(s) missing",
            where="elastic.require_all_nodes",
            hint=f"start all {strict.nodes} instances with the same run id, or use elastic mode "
            "(require_all_nodes: false) to let the live nodes finish",
        )
    return ParticipationError(
        f"{len(unclaimed)} shard(s) ({shown}) had no claimant for {timeout:g}s; nodes in run "
        f"{coordinator.run.value}: {', '.join(joined)}",
        where="elastic.wait_timeout_secs",
        hint="start a worker for the job, or raise wait_timeout_secs",
    )


def check_participation(layout: JobLayout, manifest: Manifest, strict: StrictPolicy) -> dict[str, int]:
    """Strict mode's final check: at least ``nodes`` distinct node identities completed shards
    (accepted shards per node id, from the done markers)."""
    by_node: dict[str, int] = {}
    for entry in manifest.shards:
        markers = read_markers(layout, entry.shard_id, failed=False)
        if decide_state(markers) is ShardState.DONE:
            by_node[markers.result.node_id] = by_node.get(markers.result.node_id, 0) + 1
    if len(by_node) < strict.nodes:
        shown = ", ".join(f"{node}: {n}" for node, n in sorted(by_node.items()))
        raise ParticipationError(
            f"strict mode (require_all_nodes, nodes={strict.nodes}): shards were completed by only "
            f"{len(by_node)} distinct node(s) ({shown}); {strict.nodes - len(by_node)} node(s) did not take part",
            where="elastic.require_all_nodes",
            hint="give every node its own DJ_ELASTIC_NODE_ID or hostname, and start all of them",
        )
    return by_node
