"""The scan phase of a worker: claim shards' scans under ``scans/`` (the same lease protocol as
shard runs) until every shard is scanned, then the barrier: :func:`scan_job` returns only once the
manifest exists (docs/input-format.md; fault row 30 of docs/failure-semantics.md).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from loguru import logger

from data_juicer_elastic.errors import LeaseLostError, WorkerInterrupted
from data_juicer_elastic.jobdir import attempts, leases
from data_juicer_elastic.jobdir import manifest as scans
from data_juicer_elastic.jobdir import shard_state as scan_outcome
from data_juicer_elastic.jobdir.claiming import Claimer
from data_juicer_elastic.jobdir.heartbeats import StalenessObserver
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest, load_plan, normalise_options, source_spans
from data_juicer_elastic.jobdir.records import (
    AttemptExit,
    Claim,
    FailureReason,
    JobPlan,
    Manifest,
    PlannedShard,
    ReleaseReason,
)
from data_juicer_elastic.jobdir.tasks import ScanOutput, ScanTask
from data_juicer_elastic.rows.codecs import SHARD_SUFFIX
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

RunScan = Callable[[ScanTask], ScanOutput]


def scan_job(
    layout: JobLayout,
    identity: WorkerIdentity,
    run_scan: RunScan,
    *,
    ttl_secs: float,
    heartbeat_secs: float,
    max_retries: int,
    poll_interval_secs: float,
    max_holder_deaths: int | None = None,
    stop_event: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] | None = None,
    rng: random.Random | None = None,
    wait: bool = True,
) -> Manifest | None:
    """Scan shards of a planned job until its manifest exists; the manifest (None when stopped first,
    or, with ``wait`` False, when nothing was left to claim while others still scan)."""
    if fsio.exists(layout.manifest):
        return load_manifest(layout.root)
    plan = load_plan(layout.root)
    observer = StalenessObserver(ttl_secs, clock)
    claimer = Claimer(
        layout.scans, plan, identity, observer, max_retries=max_retries, max_holder_deaths=max_holder_deaths,
        rng=rng, random_start=True,
    )  # fmt: skip
    scanner = Scanner(layout, plan, identity, run_scan, claimer, heartbeat_secs, ttl_secs, clock)
    if sleep is None:
        sleep = stop_event.wait if stop_event is not None else time.sleep
    try:
        while True:
            if fsio.exists(layout.manifest):
                return load_manifest(layout.root)
            if stop_event is not None and stop_event.is_set():
                return None
            claimed, finished = claimer.claim_next()
            if claimed is not None:
                scanner.scan(*claimed)
                continue
            if finished:
                return settle_scans(layout, plan)
            if not wait:
                return None
            sleep(poll_interval_secs)
    except (WorkerInterrupted, KeyboardInterrupt):
        if claimer.pending is not None:  # signalled between claiming a scan and starting it
            leases.release_or_warn(layout.scans, claimer.pending, ReleaseReason.SIGNAL)
        raise
    finally:
        close = getattr(run_scan, "close", None)
        if close is not None:
            close()  # e.g. its row-checking helper processes


def settle_scans(layout: JobLayout, plan: JobPlan) -> Manifest:
    """Every shard's scan has ended: the job's input error, a spent scan budget, or the manifest."""
    error, results = scan_outcome.scans_verdict(layout, plan)
    if error is not None:
        raise error
    manifest = scans.publish_manifest(layout, plan, results)
    logger.info(f"scanned {layout.root}: {manifest.total_rows} rows in {manifest.num_shards} shards")
    return manifest


class Scanner:
    """Runs one claimed scan at a time; every way out leaves a result, a failure or a release."""

    def __init__(self, layout, plan, identity, run_scan, claimer, heartbeat_secs, ttl_secs, clock):
        self.layout: JobLayout = layout
        self.plan: JobPlan = plan
        self.identity: WorkerIdentity = identity
        self.run_scan: RunScan = run_scan
        self.claimer: Claimer = claimer
        self.lease = {"heartbeat_secs": heartbeat_secs, "ttl_secs": ttl_secs, "clock": clock}  # as a shard run's
        self.options = normalise_options(plan, max_line_bytes=plan.max_line_bytes)

    def scan(self, entry: PlannedShard, claim: Claim) -> None:
        scans_layout = self.layout.scans
        heartbeater = leases.Heartbeater(scans_layout, claim, **self.lease)
        heartbeater.start()
        attempt: attempts.Attempt | None = None
        exit_reason, error = AttemptExit.LOST, None
        try:
            attempt = attempts.open_attempt(scans_layout, claim, self.identity)
            self.claimer.pending = None  # from here every way out leaves a record of this attempt
            codec, copy = self.plan.shard_codec, None
            if self.plan.copy_shards:
                copy = scans_layout.attempt_copy(entry.shard_id, claim.attempt_id, SHARD_SUFFIX[codec])
            spans = source_spans(self.plan.inputs, entry.spans)
            task = ScanTask(entry.shard_id, spans, self.options, attempt.dir, copy, codec)
            started = time.time()
            output = self.run_scan(task)
            if not heartbeater.held():
                raise LeaseLostError(heartbeater.lost_reason or "lease lost", where=f"scan of {entry.shard_id}")
            accepted, _ = scans.publish_scan(self.layout, claim, attempt.dir, output, self.identity, started)
            exit_reason = AttemptExit.DONE if accepted else AttemptExit.DISCARDED
            self.claimer.learn_done(entry.shard_id)
            what = f"refused ({output.refusal.message})" if output.refusal else f"{output.rows} rows"
            logger.info(f"scanned {entry.shard_id}: {what}, {output.bytes} bytes")
        except LeaseLostError as exc:
            error = exc.message
            logger.warning(f"scan of {entry.shard_id}: abandoning attempt {claim.attempt_id}: {exc.message}")
            leases.release_or_warn(self.layout.scans, claim, ReleaseReason.ABANDONED, f"scan of {claim.shard_id}")
            return
        except Exception as exc:
            exit_reason, error = AttemptExit.FAILED, attempts.error_text(exc)
            logger.error(f"scan of {entry.shard_id}: attempt {claim.attempt_id} failed: {type(exc).__name__}: {error}")
            try:
                self.claimer.fail(
                    claim, claim.shard_id, claim.generation, error, type(exc).__name__, FailureReason.ERROR
                )
            finally:
                leases.release_or_warn(self.layout.scans, claim, ReleaseReason.FAILED, f"scan of {claim.shard_id}")
            return
        except (WorkerInterrupted, KeyboardInterrupt, SystemExit):
            exit_reason, error = AttemptExit.SIGNAL, "interrupted"
            leases.release_or_warn(self.layout.scans, claim, ReleaseReason.SIGNAL, f"scan of {claim.shard_id}")
            raise
        finally:
            heartbeater.stop()
            attempts.close_attempt(attempt, exit_reason, error=error)
        leases.release_or_warn(self.layout.scans, claim, ReleaseReason.FINISHED, f"scan of {claim.shard_id}")
