"""Failure accounting: a generation's failure record, and the shard's terminal failure once a budget
is spent (``max_retries`` for execution failures, ``max_holder_deaths`` for ``reasons.DEATH_REASONS``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from loguru import logger

from data_juicer_elastic.jobdir import layout as confine
from data_juicer_elastic.jobdir.attempts import MAX_ERROR_CHARS
from data_juicer_elastic.jobdir.layout import JobLayout, parse_gen_name
from data_juicer_elastic.jobdir.records import DEATH_REASONS, Claim, Failure, FailureReason, TerminalFailure
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity


def split_failures(failures: list[Failure]) -> tuple[list[Failure], list[Failure]]:
    """(execution failures, holder deaths) of a shard, each in generation order."""
    deaths = [f for f in failures if f.exit_reason in DEATH_REASONS]
    return [f for f in failures if f.exit_reason not in DEATH_REASONS], deaths


@dataclass(frozen=True)
class FailureOutcome:
    recorded: bool  # False: a failure for this generation was already recorded
    failures: int  # valid failure records of the shard now
    terminal: TerminalFailure | None  # set when the retry budget is spent


def record_failure(
    layout: JobLayout,
    claim: Claim | None,
    *,
    shard_id: str,
    generation: int,
    error: str,
    error_type: str,
    exit_reason: FailureReason,
    max_retries: int,
    reporter: WorkerIdentity,
    max_holder_deaths: int | None = None,
) -> FailureOutcome:
    """Record that generation ``generation`` failed; publish failed/<shard>.json when the
    shard's execution has failed ``max_retries + 1`` times, or its holder died
    ``max_holder_deaths + 1`` times (None: deaths never fail it).  ``claim`` is the failed
    claim when known (None when its record is corrupt)."""
    record = Failure(
        shard_id=shard_id,
        generation=generation,
        attempt_id=claim.attempt_id if claim else "unknown",
        node_id=claim.node_id if claim else reporter.node_id,
        hostname=claim.hostname if claim else reporter.hostname,
        pid=claim.pid if claim else 0,
        error=error[-MAX_ERROR_CHARS:],
        error_type=error_type,
        exit_reason=exit_reason,
        failed_at=time.time(),
    )
    path = layout.failure(shard_id, generation)
    confine.ensure_dir(layout, path.parent)
    recorded = fsio.publish_bytes(path, record.encode())
    failures = list_failures(layout, shard_id)
    terminal = publish_terminal_if_exhausted(layout, shard_id, max_retries, failures, max_holder_deaths)
    return FailureOutcome(recorded, len(failures), terminal)


def list_failures(layout: JobLayout, shard_id: str) -> list[Failure]:
    """Valid failure records of a shard in generation order (corrupt ones do not count)."""
    out = []
    directory = layout.failure_dir(shard_id)
    for name in fsio.list_names(directory):
        if parse_gen_name(name) is None:
            continue
        failure, error = Failure.read_or_error(directory / name)
        if error is not None:
            logger.warning(f"ignoring corrupt failure record: {error}")
        elif failure is not None:
            out.append(failure)
    return sorted(out, key=lambda f: f.generation)


def read_terminal(layout: JobLayout, shard_id: str) -> tuple[TerminalFailure | None, str | None]:
    return TerminalFailure.read_or_error(layout.failed(shard_id))


def publish_terminal_if_exhausted(
    layout: JobLayout,
    shard_id: str,
    max_retries: int,
    failures: list[Failure] | None = None,
    max_holder_deaths: int | None = None,
) -> TerminalFailure | None:
    """The shard's terminal failure if a budget is spent (publishing it if needed): more than
    ``max_retries`` execution failures, or more than ``max_holder_deaths`` holder deaths."""
    existing, _ = read_terminal(layout, shard_id)
    if existing is not None:
        return existing
    failures = list_failures(layout, shard_id) if failures is None else failures
    errors, deaths = split_failures(failures)
    if len(errors) > max_retries:
        last = errors[-1]
    elif max_holder_deaths is not None and len(deaths) > max_holder_deaths:
        last = deaths[-1]
    else:
        return None
    terminal = TerminalFailure(
        shard_id=shard_id,
        failures=len(failures),
        max_retries=max_retries,
        last_error=last.error,
        last_attempt_id=last.attempt_id,
        generations=[f.generation for f in failures],
        failed_at=time.time(),
        max_holder_deaths=max_holder_deaths,
    )
    confine.ensure_dir(layout, layout.failed_dir)
    if fsio.publish_bytes(layout.failed(shard_id), terminal.encode()):
        logger.error(
            f"{shard_id}: {len(errors)} failed attempt(s) and {len(deaths)} holder death(s), giving up: {last.error}"
        )
        return terminal
    existing, _ = read_terminal(layout, shard_id)
    return existing or terminal
