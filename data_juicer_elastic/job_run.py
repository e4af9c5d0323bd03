"""One instance's run of an elastic job, one method per phase (docs/architecture.md, "One instance's
run").  Importing this module loads neither Data-Juicer nor Ray: the fault driver
(``tests/faults/driver.py``) subclasses :class:`JobRun` with a fake shard runner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loguru import logger

from data_juicer_elastic.console.log_files import LogFile
from data_juicer_elastic.coordination.flow import Phases, StrictPolicy, run_coordinated
from data_juicer_elastic.coordination.run import Outcome, ParticipantExit, RunCoordinator, resolve_run_id
from data_juicer_elastic.errors import ElasticError, JobDirError, MergeBusyError
from data_juicer_elastic.finalize import finalize
from data_juicer_elastic.integration.recipe import build_shard_recipe, recipe_hash
from data_juicer_elastic.jobdir.exports import export_target
from data_juicer_elastic.jobdir.layout import JobLayout, ensure_dir, open_job_dir, resolve_user_path
from data_juicer_elastic.jobdir.records import JobPlan
from data_juicer_elastic.jobdir.retry import recipe_differences
from data_juicer_elastic.jobdir.worker import WorkerSummary
from data_juicer_elastic.local_worker import run_local_worker
from data_juicer_elastic.preparation import prepare_from_cfg
from data_juicer_elastic.settings import ElasticSettings, check_strict_shares
from data_juicer_elastic.shards.merge import MergeResult, follow_merge
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity


class JobRun:
    """One instance of one submission: its context, and the phases of the flow as methods."""

    def __init__(self, cfg: Any, settings: ElasticSettings):
        self.cfg = cfg
        self.settings = settings
        self.layout = JobLayout(resolve_user_path(settings.job_dir))
        self.run_id = resolve_run_id(settings.run_id)
        self.identity = WorkerIdentity.current()
        self.strict = None  # elastic mode; strict mode (require_all_nodes): its equal shares, checked
        if settings.require_all_nodes:
            share = check_strict_shares(settings.num_shards, settings.nodes, settings.slots_per_node)
            self.strict = StrictPolicy(settings.nodes, share, settings.slots_per_node)
        self.coordinator = RunCoordinator(
            self.layout,
            self.run_id,
            self.identity,
            ttl_secs=settings.lease_ttl_secs,
            heartbeat_secs=settings.heartbeat_secs,
            poll_secs=settings.poll_interval_secs,
        )
        self.done = 0  # shards this instance completed, in its leave record
        self.merged: MergeResult | None = None  # this instance's own merge, when it was elected to finalize
        self.follower = StreamFollower(self.layout.root, cfg.export_path, settings)

    def run(self) -> MergeResult | None:
        """The whole flow for this instance; None when it left early at its ``max_shards``."""
        open_job_dir(self.layout)
        node = self.identity.node_id
        ensure_dir(self.layout, self.layout.node_log_dir(node))
        with instance_log(self.layout.node_log(node, self.coordinator.instance_id)):
            self.announce()
            self.coordinator.join(self.settings.slots_per_node)
            try:
                return self.report(self.coordinate())
            finally:
                self.follower.stop()

    def announce(self) -> None:
        """The first lines of this instance's log: which run, how its id was found, which mode."""
        settings = self.settings
        logger.info(
            f"instance {self.coordinator.instance_id} of run {self.run_id.value} (run id from {self.run_id.source}); "
            f"{'strict' if self.strict else 'elastic'} mode"
            + (f", nodes={settings.nodes}" if settings.nodes else "")
            + (f", {settings.slots_per_node} slots" if settings.slots_per_node > 1 else "")
        )
        if not self.run_id.shared:
            logger.info(
                "no scheduler job id found: set elastic.run_id (or DJ_ELASTIC_RUN_ID) to elect one "
                "prepare and one finalize among instances started by hand"
            )

    def coordinate(self) -> Outcome | None:
        """``coordination.flow`` with this object's phases; this instance's leave record on every ending."""
        settings = self.settings
        phases = Phases(self.prepare, self.check_prepared, self.work, self.finalize)
        try:
            outcome = run_coordinated(
                self.coordinator,
                phases,
                wait_timeout_secs=settings.wait_timeout_secs,
                strict=self.strict,
                user_cap=settings.max_shards is not None,
            )
        except ElasticError:
            aborted = self.coordinator.outcome()
            self.leave(ParticipantExit.ABORTED if aborted and not aborted.ok else ParticipantExit.ERROR)
            raise
        self.leave(ParticipantExit.MAX_SHARDS if outcome is None else ParticipantExit.FINALIZED)
        return outcome

    def leave(self, reason: ParticipantExit) -> None:
        self.coordinator.leave(reason, self.settings.slots_per_node, self.done)

    def prepare(self) -> tuple[JobPlan, bool]:
        """Elected leader: validate the recipe and plan the shards (idempotent); (plan, created)."""
        outcome = prepare_from_cfg(self.cfg, self.settings)
        return outcome.plan, outcome.created

    def check_prepared(self, plan: JobPlan) -> None:
        """Every other instance: refuse to work on a job planned from a different request."""
        cfg, settings, differences = self.cfg, self.settings, []
        dataset = str(resolve_user_path(cfg.dataset_path)) if getattr(cfg, "dataset_path", None) else None
        if dataset != plan.dataset_path:
            differences.append(f"dataset_path is {dataset!r} here, {plan.dataset_path!r} in the job")
        if settings.num_shards != plan.num_shards:
            differences.append(f"num_shards is {settings.num_shards} here, {plan.num_shards} in the job")
        recipe = build_shard_recipe(cfg)
        differences += recipe_differences(plan, recipe, recipe_hash(recipe))  # names the changed keys
        if differences:
            raise JobDirError(
                "this instance was started with a different job than the one prepared: " + "; ".join(differences),
                where=str(self.layout.root),
                hint="start the same command with the same recipe on every node",
            )

    def work(self, stop: threading.Event, max_done: int | None) -> WorkerSummary:
        """Claim and run shards until none is left for this instance.  The streaming merge, when on,
        starts here and follows until every shard is appended (past this phase: the shards other
        instances finish last are the tail finalize would otherwise read), or this instance ends."""
        self.follower.start()
        summary = self.run_shards(stop, max_done)
        self.done = summary.done
        return summary

    def run_shards(self, stop: threading.Event, max_done: int | None) -> WorkerSummary:
        """This node's worker: one warm Ray runtime per slot (the fault driver runs a fake runner)."""
        return run_local_worker(
            self.layout.root, self.settings, stop_event=stop, max_done=max_done, log_name=self.coordinator.instance_id
        )

    def finalize(self) -> dict[str, Any]:
        """Elected leader: verify and merge; what the outcome record keeps of the merge."""
        self.merged = finalize(
            self.layout.root,
            self.cfg.export_path,
            overwrite=self.settings.overwrite_output,
            stream=self.follower.enabled,
            lock_wait_secs=self.settings.lease_ttl_secs,
            layout=self.settings.export_layout,
        )
        return self.merged.to_details()

    def report(self, outcome: Outcome | None) -> MergeResult | None:
        """The run's merge as this instance reports it: its own, or the one the finalizer recorded."""
        if outcome is None:
            return None
        mine = outcome.instance.instance_id == self.coordinator.instance_id
        if mine and self.merged is not None:
            result = self.merged
        else:  # written: whether this instance wrote the output, so never here
            result = dataclasses.replace(MergeResult.from_details(outcome.details), written=False)
        who = "this instance" if mine else outcome.instance.describe()
        logger.info(
            f"run {self.run_id.value} finalized by {who}: merged {result.rows} rows from "
            f"{result.shards} shards into {result.output_path}"
        )
        return result


@contextlib.contextmanager
def instance_log(path: Path) -> Iterator[None]:
    """This instance's whole log (every phase, every slot-0 shard) in ``<job_dir>/logs/<node>/``;
    a full job directory costs its lines, never the run's own error (``console.log_files``)."""
    sink = logger.add(LogFile(path, "the instance log"), level="INFO", enqueue=False, backtrace=False, diagnose=False)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            logger.remove(sink)


class StreamFollower:
    """The streaming merge on a thread of this instance (``export_layout: file`` with
    ``elastic.stream_merge``, the default): every instance runs one; the partial output's lock
    lets one write, the others retry (so a follower lost with its node is replaced).  It ends
    when every shard is appended, or at :meth:`stop`; the elected finalize publishes."""

    def __init__(self, job: Path, export_path: Any, settings: ElasticSettings):
        self.job, self.export_path, self.settings = job, export_path, settings
        self.enabled = bool(settings.stream_merge and settings.export_layout == "file" and export_path)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._follow, name="dj-elastic-stream-merge", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following (a shard being appended is finished first) and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _follow(self) -> None:
        poll, stop = self.settings.poll_interval_secs, self._stop
        output = export_target(self.export_path)
        manifest = JobLayout(self.job).manifest
        while not fsio.exists(manifest):  # the shards are being scanned: nothing to merge before that
            if stop.wait(poll):
                return
        while not stop.is_set():
            try:
                follow_merge(self.job, output, wait=True, poll_secs=poll, stop=stop, publish=False)
                return
            except MergeBusyError:
                stop.wait(poll)
            except ElasticError as exc:  # a failed shard or a corrupt output: finalize reports it
                logger.warning(f"streaming merge stopped: {exc}")
                return
