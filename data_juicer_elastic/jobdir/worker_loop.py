"""The worker loop: claim shards, run them (``shard_attempt.ShardWorker``), honour limits and
signals, and release whatever is still claimed (ahead) on every way out.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from data_juicer_elastic.errors import WorkerInterrupted, storage_error
from data_juicer_elastic.jobdir import layout as confine
from data_juicer_elastic.jobdir import progress
from data_juicer_elastic.jobdir.claim_ahead import ClaimAhead
from data_juicer_elastic.jobdir.job_summary import IdleBackoff, PaceWriter, SummaryReader, register_reader
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import check_shard_files, load_manifest
from data_juicer_elastic.jobdir.records import ReleaseReason, StopReason
from data_juicer_elastic.jobdir.roles import SummaryKeeper
from data_juicer_elastic.jobdir.scan_loop import RunScan, scan_job
from data_juicer_elastic.jobdir.shard_attempt import RunShard, ShardWorker, WorkerSummary
from data_juicer_elastic.jobdir.shard_state import leaving_outcome
from data_juicer_elastic.jobdir.worker_settings import WorkerSettings
from data_juicer_elastic.jobdir.worker_signals import SignalGuard, honour
from data_juicer_elastic.rows.shard_source import ShardSource
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity


def run_worker(
    job_dir: str | Path,
    identity: WorkerIdentity,
    run_shard: RunShard,
    settings: WorkerSettings,
    *,
    stop_event: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] | None = None,
    claim_gate: Callable[[], bool] | None = None,
    claim_rng: random.Random | None = None,
    on_attempt: Callable[[progress.ProgressTracker], None] | None = None,
    before_claim: Callable[[], bool] | None = None,
    read_ahead: Callable[[ShardSource], object] | None = None,
    run_scan: RunScan | None = None,
) -> WorkerSummary:
    """Process shards of ``job_dir`` until the job is finished (or a limit of ``settings`` is reached);
    the arguments: docs/architecture.md, ``jobdir.worker_loop.run_worker``.  The job summary's keeper
    runs in a thread with the default clock, else from this loop."""
    ttl_secs, heartbeat_secs = settings.ttl_secs, settings.heartbeat_secs
    max_shards, max_done = settings.max_shards, settings.max_done
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    summary = WorkerSummary()
    if sleep is None:
        sleep = stop_event.wait if stop_event is not None else time.sleep
    scanned = None
    if run_scan is not None and not fsio.exists(layout.manifest) and fsio.exists(layout.plan):
        confine.check_layout(layout)
        with SignalGuard() as guard:
            try:
                scanned = scan_job(
                    layout, identity, run_scan, ttl_secs=ttl_secs, heartbeat_secs=heartbeat_secs,
                    max_retries=settings.max_retries, poll_interval_secs=settings.poll_interval_secs,
                    max_holder_deaths=settings.max_holder_deaths, stop_event=stop_event, clock=clock, sleep=sleep,
                    rng=claim_rng, wait=settings.wait_for_completion,
                )  # fmt: skip
            except OSError as exc:
                raise storage_error(exc, layout.root) from exc
            except WorkerInterrupted as interrupt:
                logger.warning(f"worker stopping on signal {interrupt.signum} (scanning)")
                honour(guard, interrupt.signum)
                summary.stop_reason = StopReason.INTERRUPTED
                return summary
        if scanned is None:  # stopped, or nothing to scan here and no waiting, before the input was known
            stopped = stop_event is not None and stop_event.is_set()
            summary.stop_reason = StopReason.STOPPED if stopped else StopReason.NO_WORK
            return summary
    # refuse a corrupt job before claiming anything (the scans' manifest was loaded and checked so)
    manifest = scanned if scanned is not None else load_manifest(layout.root)
    confine.check_layout(layout)  # and one whose directories lead elsewhere
    check_shard_files(layout.root, manifest)
    reader = SummaryReader(layout, manifest, ttl_secs=ttl_secs, clock=clock) if settings.job_summary else None
    if reader is not None:
        register_reader(reader)
    worker = ShardWorker(
        layout, manifest, identity, run_shard, summary, settings, clock, claim_gate=claim_gate, rng=claim_rng,
        before_claim=before_claim, summary_reader=reader,
    )  # fmt: skip
    worker.on_attempt = on_attempt
    keeper = None
    if reader is not None:
        worker.pace = PaceWriter(layout, identity)
        keeper = SummaryKeeper(layout, manifest, identity, worker.pace, reader, **worker.lease)
        if clock is time.monotonic:
            keeper.start()
    idle = IdleBackoff(settings.poll_interval_secs, reader)

    def limit_reached(running: int = 0) -> StopReason | None:
        """Why the loop must stop now; ``running``: count that many more shards done (a shard
        claimed ahead only when the limits would let this worker run it next)."""
        if stop_event is not None and stop_event.is_set():
            return StopReason.STOPPED
        if max_shards is not None and summary.claimed >= max_shards:
            return StopReason.MAX_SHARDS
        if max_done is not None and summary.done + running >= max_done:
            return StopReason.MAX_DONE
        return None

    if settings.claim_ahead:
        worker.ahead = ClaimAhead(
            layout, manifest, worker.claim_next, read_ahead=read_ahead, on_release=worker.let_go, **worker.lease
        )
        worker.may_claim_ahead = lambda: limit_reached(running=1) is None  # claimed counts the running one

    with SignalGuard() as guard:
        try:
            while True:
                if (reason := limit_reached()) is not None:
                    summary.stop_reason = reason
                    break
                if keeper is not None and clock is not time.monotonic:
                    keeper.tick_if_due()
                # A shard claimed ahead while the last one ran comes first (its claim, check and
                # read are done); else claim one now.
                claimed, finished = worker.take_ahead(), False
                if claimed is None:
                    claimed, finished = worker.claim_next()
                if claimed is not None:
                    idle.reset()
                    worker.run(*claimed)
                    worker.claimer.pending = None
                    continue
                if finished:
                    summary.stop_reason = StopReason.FINISHED
                    break
                if not settings.wait_for_completion:
                    summary.stop_reason = StopReason.NO_WORK
                    break
                if worker.pace is not None:
                    worker.pace.flush()  # what we finished last is in the summary while we wait
                sleep(idle.next_wait())
        except OSError as exc:
            # The job directory refused a write the loop cannot do without (claim, failure
            # record): stop with one clear error naming the path instead of a traceback.
            raise storage_error(exc, layout.root, places=(("job directory", layout.root),)) from exc
        except WorkerInterrupted as interrupt:
            # The guard stays installed meanwhile: a second SIGTERM (a scheduler's repeat, a
            # process group's) is absorbed instead of killing the worker before it released.
            if worker.claimer.pending is not None:  # signalled between claiming and running: give it back
                worker.release(worker.claimer.pending, ReleaseReason.SIGNAL)
            if worker.ahead is not None:  # and the shard claimed ahead (a claim in flight: once made)
                worker.ahead.close(ReleaseReason.SIGNAL, why="signal", wait_secs=heartbeat_secs)
            logger.warning(f"worker stopping on signal {interrupt.signum}")
            honour(guard, interrupt.signum)
            summary.stop_reason = StopReason.INTERRUPTED  # the previous handler chose not to exit
        finally:
            # Every other way out (a stop, a limit, an error): nothing stays claimed ahead.
            if worker.ahead is not None:
                worker.ahead.close(ReleaseReason.UNRUN, why=f"worker stopping: {summary.stop_reason or 'error'}")
                summary.unrun = worker.ahead.unrun
            if keeper is not None:
                keeper.stop()  # a last round, and the writer's lease released for the next writer
    summary.complete, summary.terminal_failures = leaving_outcome(
        layout, manifest, worker.claimer.known_done, None if summary.stop_reason == StopReason.FINISHED else reader
    )
    return summary
