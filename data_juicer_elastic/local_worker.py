"""The node's worker (``dj-elastic worker`` and each instance's run phase, ``job_run.JobRun.run_shards``):
:func:`run_local_worker` claims and runs shards with one warm node-local Ray runtime per slot.  It
loads no engine when imported: Ray and Data-Juicer start inside ``execution``'s runner, once there is
a shard to run, so ``dj-elastic worker`` refuses a bad job dir before either loads.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import threading

from loguru import logger

from data_juicer_elastic.cli_options import WORKER_OPTIONS, setting_args
from data_juicer_elastic.console import JobDisplay
from data_juicer_elastic.console.summary import run_clock_start
from data_juicer_elastic.coordination.slots import CUDA_ENV, SlotPool, slot_argv, slot_cpus, slot_devices, slot_env
from data_juicer_elastic.coordination.stragglers import ClaimGate
from data_juicer_elastic.dedup.phases import dedup_phases
from data_juicer_elastic.execution.ray_runtime import LazyShardRunner, restart_worker_process
from data_juicer_elastic.execution.shard_runner import default_cache_env
from data_juicer_elastic.integration.dedup_check import recipe_stages
from data_juicer_elastic.jobdir.layout import JobLayout, check_layout, ensure_dir, resolve_user_path
from data_juicer_elastic.jobdir.manifest import load_job, load_manifest
from data_juicer_elastic.jobdir.records import Manifest
from data_juicer_elastic.jobdir.retry import job_code
from data_juicer_elastic.jobdir.worker import WorkerSettings, WorkerSummary, run_worker
from data_juicer_elastic.settings import ElasticSettings
from data_juicer_elastic.shards.scan import ShardScanner
from data_juicer_elastic.sharedfs.identity import WorkerIdentity


def run_local_worker(
    job_dir: str | os.PathLike,
    settings: ElasticSettings,
    *,
    wait_for_completion: bool = True,
    slots: int | None = None,
    stop_event: threading.Event | None = None,
    max_done: int | None = None,
    log_name: str | None = None,
) -> WorkerSummary:
    """Claim and process shards until nothing is left, with ``slots`` shards at a time.

    Slot 0 runs here with one warm Ray runtime, started when there is a shard to claim and before
    claiming it (a worker with nothing to do costs no Ray start; one killed while Ray starts holds
    no claim).  Slots 1..S-1 are child processes; the summary is slot 0's (it waits for theirs)."""
    job = resolve_user_path(job_dir)
    layout = JobLayout(job)
    # The plan holds what a worker needs to start (the recipe, its code, Ray's settings); the
    # manifest (row counts, the row schema) exists once the scans are done, read once then.
    manifest = load_job(job)
    scanned = isinstance(manifest, Manifest)
    scanned_manifest = (lambda: manifest) if scanned else functools.cache(lambda: load_manifest(job))
    check_layout(layout)  # before the cache and logs are pointed into it
    # Model caches default into the shared job dir (one download for every node); set
    # here, before slot processes are started, so they inherit the same values.
    default_cache_env(layout.cache_dir)
    identity = WorkerIdentity.current()
    slots = settings.slots_per_node if slots is None else slots
    devices = slot_devices(os.environ.get(CUDA_ENV), slots)
    cpus = slot_cpus(settings.ray_num_cpus, slots)
    if devices[0] is not None:
        os.environ[CUDA_ENV] = devices[0]  # before this process's Ray runtime starts
    runner = LazyShardRunner(
        manifest.recipe,
        list(manifest.stage_identities),
        layout.cache_dir,
        row_schema=lambda: scanned_manifest().row_schema,  # known once the job is scanned
        ray_address=settings.ray_address,
        ray_num_cpus=cpus,
        code=job_code(layout, manifest.code),  # the latest code a retry accepted, else prepare's
        allow_version_mismatch=settings.allow_version_mismatch,
        max_error_rows=settings.max_error_rows,
        # the deduplicators with their default operators' arguments (a Ray version's own keys dropped)
        stages=recipe_stages(manifest.recipe),
        restart_process=lambda: restart_worker_process(before=lambda: _stop_slots(pool)),
    )
    if not scanned:
        runner.start_early()  # Ray starts while the job is scanned: the first shard need not wait for it
    # Strict mode's equal shares already decide who runs what; elsewhere slow nodes leave the tail to fast ones.
    gate = None
    if max_done is None:  # built when first asked, once the job is scanned (it reads the manifest)
        build = functools.cache(
            lambda: ClaimGate(
                layout,
                scanned_manifest(),
                identity.node_id,
                identity.pid,
                min_interval=settings.poll_interval_secs,
                startup_secs=lambda: runner.runtime.start_secs,
            )
        )
        gate = lambda: build()()  # noqa: E731
    logger.info(f"worker {identity.node_id} (pid {identity.pid}) joining job {job} with {slots} slot(s)")
    with SlotPool() as pool:
        # Each slot is given this instance's settings (its own share of the CPUs, the heartbeat it uses).
        slot = dataclasses.replace(settings, ray_num_cpus=cpus, heartbeat_interval_secs=settings.heartbeat_secs)
        argv = slot_argv(job, setting_args(slot, WORKER_OPTIONS), max_done)
        name = log_name or identity.new_attempt_id()
        if slots > 1:
            ensure_dir(layout, layout.node_log_dir(identity.node_id))
        for k in range(1, slots):
            pool.start(
                k, argv, slot_env(identity.node_id, devices[k]), layout.node_log(identity.node_id, f"{name}-slot{k}")
            )
        shard_rows = {entry.shard_id: entry.rows for entry in manifest.shards} if scanned else None
        planned = {entry.shard_id: entry.bytes for entry in manifest.shards}
        waiting = lambda: "starting Ray" if runner.starting else ""  # noqa: E731 - the live line names the wait
        # random_start: fresh workers (replacements after kills) spread over the pending shards
        worker = WorkerSettings.from_elastic(
            settings, max_done=max_done, wait_for_completion=wait_for_completion, random_start=True
        )
        # a live line: its elapsed time is the run's (from its submission), as the plan's and the merge's;
        # it counts this node's running shards (this process's, and its other slots' by their progress records)
        display = JobDisplay(job, shard_rows, planned_bytes=planned, waiting=waiting, node_id=identity.node_id,
                             started=run_clock_start(job))  # fmt: skip
        with runner, display:
            summary = run_worker(
                job,
                identity,
                runner,
                worker,
                stop_event=stop_event,
                claim_gate=gate,
                on_attempt=display.attach,  # this process's running shards count in the display
                before_claim=runner.ready,  # code checked and Ray up before a claim is held
                read_ahead=runner.read_ahead,
                run_scan=ShardScanner(),  # a planned job is scanned first, this worker taking its share
                # a recipe's deduplication phases before its shards, with the runner's signature phase
                # (execution: runner.signatures(SignatureTask) -> SignatureOutput, on the same warm runtime)
                phases=dedup_phases(getattr(runner, "signatures", None)),
            )
        if stop_event is not None and stop_event.is_set():
            pool.stop()  # the run was aborted: every slot gives its claim back now
    logger.info(f"worker {identity.node_id} finished: {summary}")
    return summary


def _stop_slots(pool: SlotPool, wait_secs: float = 30.0) -> None:
    """Before this worker restarts itself (exec), its slots hand their claims back and end:
    the restarted worker starts its own."""
    pool.stop()
    for proc in pool.procs.values():
        try:
            proc.wait(timeout=wait_secs)
        except subprocess.TimeoutExpired:
            proc.kill()
