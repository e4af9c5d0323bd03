"""One instance's way through a run: prepare (plan) -> work (scan, run) -> settle -> finalize -> outcome.

The steps that touch Ray or Data-Juicer are passed in as callables
(:class:`Phases`), so the whole protocol runs, and is tested, without either.
Every ending goes through the run's one ``outcome.json``: whoever finalizes or
aborts publishes it (first wins), every instance reports that record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loguru import logger

from data_juicer_elastic.coordination.elections import PhaseHeartbeater, RunCoordinator, raise_outcome
from data_juicer_elastic.coordination.run_records import FINALIZE, PREPARE, WORK, Outcome, PrepareResult
from data_juicer_elastic.coordination.settle import (
    AbortWatcher,
    StrictPolicy,
    check_participation,
    shard_failed_error,
    wait_settled,
)
from data_juicer_elastic.errors import ElasticError, InputChangedError, InputError
from data_juicer_elastic.jobdir.job_summary import reader_for
from data_juicer_elastic.jobdir.manifest import load_manifest, load_plan
from data_juicer_elastic.jobdir.plan_records import JobPlan
from data_juicer_elastic.jobdir.records import Manifest
from data_juicer_elastic.jobdir.shard_state import leaving_outcome
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


@dataclass(frozen=True)
class Timing:
    ttl_secs: float
    poll_secs: float
    wait_timeout_secs: float


def run_coordinated(
    c: RunCoordinator,
    phases: Phases,
    timing: Timing,
    *,
    strict: StrictPolicy | None = None,
    user_cap: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome | None:
    """The run's ok outcome, or None when this instance left early at its ``max_shards``; raises the
    run's error (ElasticError, exit 2) when it was aborted."""
    _prepare(c, phases)
    existing = c.outcome()
    if existing is not None:  # a late joiner: the run has ended already; redo nothing
        logger.info(f"run {c.run.value} has already ended; reporting its outcome")
        return _report(existing)

    stop = threading.Event()
    with AbortWatcher(c, stop, timing.poll_secs) as watcher:
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
        wait_settled(
            c,
            manifest,
            wait_timeout_secs=timing.wait_timeout_secs,
            ttl_secs=timing.ttl_secs,
            poll_secs=timing.poll_secs,
            strict=strict,
            clock=clock,
            sleep=sleep,
        )
    return _report(_finalize(c, phases, manifest, strict))


def _prepare(c: RunCoordinator, phases: Phases) -> JobPlan:
    won, leader = c.elect(PREPARE)
    if won:
        with PhaseHeartbeater(c, PREPARE):
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
    logger.info(f"job planned by {leader.instance.describe()}: {plan.num_shards} shards")
    phases.check_prepared(plan)
    return plan


def _finalize(c: RunCoordinator, phases: Phases, manifest: Manifest, strict: StrictPolicy | None) -> Outcome:
    won, leader = c.elect(FINALIZE)
    if not won:
        return c.await_phase(FINALIZE, leader, c.outcome)
    with PhaseHeartbeater(c, FINALIZE):
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
