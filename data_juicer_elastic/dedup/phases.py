"""The deduplication phases as task kinds of the worker loop, on the job directory's task queue.

For each stage ``k`` of the recipe (``stages.dedup_stages``), in order, before the shards:

1. ``signatures`` (``dedup/<k>/signatures/``, one task per shard): the injected runner
   (``RunSignatures``: the engine side runs ``stages.signature_recipe`` on the shard, earlier stages'
   drops applied) returns the input row numbers and keys of the rows reaching the deduplicator;
   published as ``<shard>.sig`` (``signatures.publish_signatures``).
2. ``buckets`` (``dedup/<k>/buckets/``): the bucket plan (``plan.json``: ``buckets.bucket_groups`` of
   every shard's signature file; published once, first wins, checksummed), then one task per bucket
   group: ``dedup/<k>/edges/<task>.edges`` (``buckets.run_bucket``).
3. ``cluster`` (``dedup/<k>/cluster/``, one task): ``clusters.run_cluster`` (MinHash, SimHash) or
   ``clusters.star_drops`` (exact) into ``dedup/<k>/drops/<shard>.drops``, then the marker
   ``dedup/<k>/cluster.json`` (rows reaching the stage, rows dropped, per shard).

Every attempt runs through ``TaskQueue.attempt`` (leases, heartbeats, fencing before publication,
retry and holder-death budgets, takeover: as for shards).  A task is done when its published file
checks (header, identity, what it is for); a file refused (``errors.IntegrityError``: truncated,
tampered, another recipe's) is never used: its task runs again.  A task that finds one of its *inputs*
refused (a signature file read by a bucket task, an edge file read by the cluster step, an earlier
stage's drop list) moves it aside (``.<name>.refused-<attempt>``), hands its claim back without spending
its budget, and the phases start over from the first stage: the refused file's task runs again.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
from loguru import logger

from data_juicer_elastic.dedup import buckets, clusters, signatures
from data_juicer_elastic.dedup.hash_quarantine import errors_digest
from data_juicer_elastic.dedup.phase_records import CLUSTER_KIND, PLAN_KIND, publish_phase_record, read_phase_record
from data_juicer_elastic.dedup.stages import DedupStage, dedup_stages, stage_identity
from data_juicer_elastic.dedup.tables import TableReader
from data_juicer_elastic.errors import ConfigError, IntegrityError, ShardFailedError, is_worker_fault
from data_juicer_elastic.jobdir.attempts import Attempt, SignatureOutput, SignatureTask
from data_juicer_elastic.jobdir.layout import DEDUP_PHASES, ROLE_TASK, JobLayout, ensure_dir, shard_id
from data_juicer_elastic.jobdir.manifest import check_shard_file
from data_juicer_elastic.jobdir.records import Claim, Manifest, ReleaseReason, StopReason, TakeoverReason
from data_juicer_elastic.jobdir.task_queue import (
    AttemptScope,
    TaskQueue,
    publish_claim,
    publish_terminal_if_exhausted,
    read_lease,
    release_claim,
    takeover_reason,
)
from data_juicer_elastic.jobdir.worker import work
from data_juicer_elastic.sharedfs import fsio

RunSignatures = Callable[[SignatureTask], SignatureOutput]
SIGNATURES, BUCKETS, CLUSTER = DEDUP_PHASES
MAX_RANGES: Final = 64  # bucket groups of a stage (each one key range of every band): at most this many
MAX_PASSES: Final = 8  # starts over after a refused input before the worker gives up with an error
REFUSED_INPUT: Final = "refused_input"  # the attribute an input's IntegrityError carries (its path)


def ranges_for(num_shards: int) -> int:
    """Bucket groups of a stage: one per shard up to ``MAX_RANGES`` (a group reads every shard's file)."""
    return max(1, min(MAX_RANGES, num_shards))


def set_aside(path: Path, attempt_id: str) -> None:
    """Move a refused phase file out of the way (kept for a look, hidden from every reader)."""
    with contextlib.suppress(FileNotFoundError):
        fsio.move(path, path.with_name(f".{path.name}.refused-{attempt_id}"))


@contextlib.contextmanager
def reading_inputs(paths: set[Path], attempt_id: str) -> Iterator[None]:
    """An IntegrityError naming one of ``paths`` (an earlier phase's file): that file set aside and the
    error marked as the input's, so the attempt hands its claim back unspent and the phases start over."""
    try:
        yield
    except IntegrityError as exc:
        where = Path(exc.where) if exc.where else None
        if where in paths:
            logger.warning(f"{where}: refused ({exc.message}); setting it aside, its task runs again")
            set_aside(where, attempt_id)
            setattr(exc, REFUSED_INPUT, str(where))
        raise
    except FileNotFoundError as exc:
        if exc.filename is None or Path(exc.filename) not in paths:
            raise
        # set aside by another worker that found it refused (it runs its task again)
        missing = IntegrityError("is gone (set aside as refused)", where=str(exc.filename))
        setattr(missing, REFUSED_INPUT, str(exc.filename))
        raise missing from exc


def input_refused(exc: BaseException) -> bool:
    return getattr(exc, REFUSED_INPUT, None) is not None


class Phase:
    """One phase of one stage as a kind of the worker loop (``jobdir.worker.run_loop``)."""

    name = ""

    def __init__(self, job: DedupPhases, stage: DedupStage):
        self.job, self.stage, self.files = job, stage, job.layout
        self.queue: TaskQueue = job.queue_of(job.layout.dedup_tasks(stage.number, self.name))
        self.layout = self.queue.layout
        self.identity = stage_identity(job.manifest.recipe_hash, stage)
        self.label = f" ({job.describe(stage)}: {self.name})"
        self.done: set[str] = set()
        self.back = False  # an input was refused: the phases start over

    # -- what a phase defines ------------------------------------------------------
    def task_ids(self) -> list[str]:
        raise NotImplementedError

    def valid(self, task_id: str) -> bool:
        """The task's published file(s) check: it is done."""
        raise NotImplementedError

    def execute(self, task_id: str, scope: AttemptScope, attempt: Attempt) -> None:
        """Run the task and publish its file(s) after ``scope.fence()``."""
        raise NotImplementedError

    # -- the kind's protocol ---------------------------------------------------------
    def stop_reason(self) -> StopReason | None:
        if self.back or (self.job.stop_event is not None and self.job.stop_event.is_set()):
            return StopReason.STOPPED
        return None

    def checked(self, task_id: str) -> bool:
        try:
            return self.valid(task_id)
        except IntegrityError as exc:
            logger.warning(f"{self.what(task_id)}: {exc}; running it again")
            return False
        except FileNotFoundError:
            return False  # set aside (refused) between a look and the read

    def claim(self) -> tuple[tuple[str, Claim] | None, bool]:
        queue, pending = self.queue, False
        for task_id in self.task_ids():
            if task_id in self.done:
                continue
            if self.checked(task_id):
                self.done.add(task_id)
                continue
            terminal = publish_terminal_if_exhausted(
                self.layout, task_id, queue.max_retries, None, queue.max_holder_deaths
            )
            if terminal is not None:
                raise ShardFailedError(
                    f"{self.what(task_id)} failed {terminal.failures} time(s): {terminal.last_error}",
                    where=str(self.layout.failed(task_id)),
                    hint="fix the cause, then remove the job's dedup directory to run the phases again",
                )
            view = read_lease(self.layout, task_id)
            reason = takeover_reason(view, queue.identity, queue.observer)
            if reason is None and view.release is not None:
                if self.checked(task_id):  # its holder published and released since our first look
                    self.done.add(task_id)
                    continue
                reason = TakeoverReason.RELEASED  # finished, but its file is missing or refused: run it again
            if reason is None:
                pending = True
                continue
            if reason in (TakeoverReason.STALE, TakeoverReason.HOLDER_DEAD):
                if queue.record_takeover(view, reason).terminal is not None:  # a death, against its own budget
                    pending = True  # raised on the next look
                    continue
            claim = publish_claim(self.layout, view, queue.identity, queue.identity.new_attempt_id(), reason)
            if claim is None:
                pending = True  # another worker won this generation
                continue
            queue.pending = claim
            if self.checked(task_id):  # published meanwhile by a slow attempt
                release_claim(self.layout, claim, ReleaseReason.FINISHED)
                queue.pending = None
                self.done.add(task_id)
                continue
            logger.info(f"claimed {self.what(task_id)} gen {claim.generation} ({reason}) as {claim.attempt_id}")
            return (task_id, claim), False
        return None, not pending

    def run(self, task_id: str, claim: Claim) -> None:
        heartbeater = self.queue.heartbeater(claim)
        heartbeater.start()
        fault = lambda exc: is_worker_fault(exc) or input_refused(exc)  # noqa: E731
        try:
            with self.queue.attempt(claim, heartbeater, self.what(task_id), worker_fault=fault) as scope:
                self.execute(task_id, scope, scope.open())
        except IntegrityError as exc:
            if not input_refused(exc):
                raise
            self.back = True  # the next claim() would not see it: the phases start over

    def what(self, task_id: str) -> str:
        return f"{self.job.describe(self.stage)} {self.name} {task_id}"

    def idle_secs(self) -> float:
        return self.job.poll_secs

    def interrupted(self) -> None:
        self.queue.release_pending()

    def close(self, reason: StopReason | None) -> None:
        pass

    # -- shared reads ----------------------------------------------------------------
    def signature_paths(self) -> list[Path]:
        number = self.stage.number
        return [self.files.dedup_signatures(number, entry.shard_id) for entry in self.job.manifest.shards]

    def open_signatures(self, every_band: bool = False) -> list:
        return [
            signatures.open_signatures(path, identity=self.identity, every_band=every_band)
            for path in self.signature_paths()
        ]


class Signatures(Phase):
    name = SIGNATURES

    def task_ids(self) -> list[str]:
        return [entry.shard_id for entry in self.job.manifest.shards]

    def valid(self, task_id: str) -> bool:
        path = self.files.dedup_signatures(self.stage.number, task_id)
        if not fsio.exists(path):
            return False
        meta = signatures.open_signatures(path, identity=self.identity).meta
        index, entry = self.job.entry(task_id)
        return (meta["shard"], meta["input_rows"], meta["method"]) == (index, entry.rows, self.stage.method.name)

    def execute(self, task_id: str, scope: AttemptScope, attempt: Attempt) -> None:
        index, entry = self.job.entry(task_id)
        earlier = {self.files.dedup_drops(s.number, task_id) for s in self.job.stages[: self.stage.number - 1]}
        with reading_inputs(earlier, attempt.claim.attempt_id):
            drops = self.job.drops(task_id, below=self.stage.number)
        source = check_shard_file(JobLayout(self.files.root), self.job.manifest, entry)
        task = SignatureTask(
            stage=self.stage.number, shard_id=task_id, shard_index=index, source=source, attempt_dir=attempt.dir,
            attempt_id=attempt.claim.attempt_id, generation=attempt.claim.generation, input_rows=entry.rows,
            drops=drops,
        )  # fmt: skip
        method = self.stage.method.name
        if entry.rows:
            output = self.job.run_signatures(task)
        else:
            output = SignatureOutput(np.empty(0, np.uint64), np.empty((0, 0, 2), np.uint64), method)
        if output.method != method:
            raise ValueError(f"the signature runner returned {output.method!r} keys for a {method!r} stage")
        for earlier_stage, dropped in drops.items():
            if np.isin(output.rows, dropped).any():
                raise ValueError(f"the signature runner returned rows that stage {earlier_stage} drops")
        scope.fence()
        path = self.files.dedup_signatures(self.stage.number, task_id)
        ensure_dir(self.files, path.parent)
        signatures.publish_signatures(
            path, identity=self.identity, shard=index, keys=output.keys, rows=output.rows, input_rows=entry.rows,
            method=method, params=output.params, failed=output.failed,
            errors=None if output.errors_path is None else self.files.relative(output.errors_path),
            errors_digest=errors_digest(output.errors_path),
        )  # fmt: skip
        scope.ended(True, output, rows=len(output.rows), quarantined=len(output.failed))


class Buckets(Phase):
    name = BUCKETS

    def __init__(self, job: DedupPhases, stage: DedupStage):
        super().__init__(job, stage)
        self.groups: list[list[list[Any]]] | None = None  # the plan's, once read or published
        self.distance = 0

    def plan(self) -> list[list[list[Any]]]:
        """The stage's bucket plan: the published one when it checks, else computed and published."""
        if self.groups is not None:
            return self.groups
        path = self.files.dedup_bucket_plan(self.stage.number)
        try:
            found = read_phase_record(path, PLAN_KIND, self.identity)
        except IntegrityError as exc:
            logger.warning(f"{exc}; recomputing the bucket plan")
            fsio.remove(path)
            found = None
        if found is None:
            with reading_inputs(set(self.signature_paths()), "plan"):
                readers = self.open_signatures(every_band=True)
                groups = buckets.bucket_groups(readers, ranges_for(len(readers)))
                params = next((r.meta["params"] for r in readers if r.meta["rows"]), {})
            body = {
                "stage": self.stage.number, "method": self.stage.method.name,
                "distance": int(params.get("distance", 0)),  # SimHash's hamming_distance
                "groups": [[[t.band, t.low, t.high] for t in group] for group in groups],
            }  # fmt: skip
            ensure_dir(self.files, path.parent)
            found = publish_phase_record(path, PLAN_KIND, self.identity, body)
        self.groups, self.distance = found["groups"], found["distance"]
        return self.groups

    def claim(self):
        try:
            self.plan()
        except IntegrityError as exc:
            if not input_refused(exc):
                raise
            self.back = True
            return None, False
        return super().claim()

    def task_ids(self) -> list[str]:
        groups = self.plan()
        return [shard_id(number, len(groups)) for number in range(len(groups))]

    def group(self, task_id: str) -> list[list[Any]]:
        return self.plan()[int(task_id[5:10])]

    def valid(self, task_id: str) -> bool:
        path = self.files.dedup_edges(self.stage.number, task_id)
        if not fsio.exists(path):
            return False
        return buckets.open_edges(path, identity=self.identity).meta["tasks"] == self.group(task_id)

    def execute(self, task_id: str, scope: AttemptScope, attempt: Attempt) -> None:
        group = tuple(buckets.BucketTask(band, low, high) for band, low, high in self.group(task_id))
        out = self.files.dedup_edges(self.stage.number, task_id)
        ensure_dir(self.files, out.parent)
        with reading_inputs(set(self.signature_paths()), attempt.claim.attempt_id):
            readers = self.open_signatures(every_band=True)
            result = buckets.run_bucket(
                group, readers, out, identity=self.identity, method=self.stage.method.name,
                distance=self.distance, before_publish=scope.fence,
            )  # fmt: skip
        scope.ended(True, result, rows=result.edges)


class Cluster(Phase):
    name = CLUSTER

    def task_ids(self) -> list[str]:
        return [ROLE_TASK]

    def valid(self, task_id: str) -> bool:
        marker = read_phase_record(self.files.dedup_cluster(self.stage.number), CLUSTER_KIND, self.identity)
        if marker is None or len(marker.get("per_shard") or ()) != len(self.job.manifest.shards):
            return False
        for index, entry in enumerate(self.job.manifest.shards):
            path = self.files.dedup_drops(self.stage.number, entry.shard_id)
            if not fsio.exists(path):
                return False
            meta = TableReader(path, kind=clusters.KIND, identity=self.identity).meta
            if (meta["shard"], meta["rows"], meta["dropped"]) != (index, entry.rows, marker["per_shard"][index]):
                return False
        return True

    def execute(self, task_id: str, scope: AttemptScope, attempt: Attempt) -> None:
        number, shards = self.stage.number, self.job.manifest.shards
        plan_path = self.files.dedup_bucket_plan(number)
        with reading_inputs({plan_path}, attempt.claim.attempt_id):
            plan = read_phase_record(plan_path, PLAN_KIND, self.identity)
        if plan is None:
            raise IntegrityError("the bucket plan is gone", where=str(plan_path))
        count = len(plan["groups"])
        edge_paths = [self.files.dedup_edges(number, shard_id(i, count)) for i in range(count)]
        drop_path = lambda index: self.files.dedup_drops(number, shards[index].shard_id)  # noqa: E731
        ensure_dir(self.files, drop_path(0).parent)
        sizes = [entry.rows for entry in shards]
        with reading_inputs(set(edge_paths) | set(self.signature_paths()), attempt.claim.attempt_id):
            edges = [buckets.open_edges(path, identity=self.identity) for path in edge_paths]
            metas = [reader.meta for reader in self.open_signatures()]
            # rows whose compute_hash raised (quarantined by the signature run): the stage drops them too
            failed = [np.asarray(meta.get("failed") or [], dtype=np.int64) for meta in metas]
            reached = [meta["rows"] + len(rows) for meta, rows in zip(metas, failed, strict=True)]
            if self.stage.method.name == "exact":
                found = [
                    np.union1d(clusters.star_drops(edges, index, rows), failed[index])
                    for index, rows in enumerate(sizes)
                ]
                scope.fence()
                dropped = [
                    clusters.publish_drop_list(drop_path(i), identity=self.identity, shard=i, rows=rows, drops=found[i])
                    for i, rows in enumerate(sizes)
                ]
                rounds = 0
            else:
                result = clusters.run_cluster(
                    edges, sizes, drop_path, identity=self.identity, scratch=Path(tempfile.gettempdir()),
                    before_publish=scope.fence, extra_drops=failed,
                )  # fmt: skip
                dropped, rounds = list(result.dropped), result.rounds
        failures = sum(len(rows) for rows in failed)
        body = {
            "stage": number, "op": self.stage.op_name, "position": self.stage.position,
            "method": self.stage.method.name, "rows": sum(reached), "dropped": sum(dropped) - failures,
            "failed": failures, "per_shard": dropped, "rounds": rounds,
        }  # fmt: skip
        scope.fence()
        publish_phase_record(self.files.dedup_cluster(number), CLUSTER_KIND, self.identity, body)
        logger.info(f"{self.job.describe(self.stage)}: {body['dropped']} of {sum(reached)} rows dropped as copies")
        scope.ended(True, body, rows=body["dropped"])


PHASES: Final = (Signatures, Buckets, Cluster)


class DedupPhases:
    """The deduplication phases of one job for one worker: :meth:`work` runs every stage's phases
    until each is published (or the loop stops); :meth:`drops` gives a shard its drop lists."""

    def __init__(
        self, layout: JobLayout, manifest: Manifest, stages: list[DedupStage], run_signatures: RunSignatures | None,
        queue_of: Callable[[JobLayout], TaskQueue], *, poll_secs: float, stop_event=None,
    ):  # fmt: skip
        self.layout, self.manifest, self.stages = layout, manifest, stages
        self.run_signatures, self.queue_of = run_signatures, queue_of
        self.poll_secs, self.stop_event = poll_secs, stop_event
        self.index = {entry.shard_id: i for i, entry in enumerate(manifest.shards)}

    def entry(self, task_id: str):
        index = self.index[task_id]
        return index, self.manifest.shards[index]

    def describe(self, stage: DedupStage) -> str:
        """``dedup 1/2 document_minhash_deduplicator``: how logs and status name a stage."""
        return f"dedup {stage.number}/{len(self.stages)} {stage.op_name}"

    def work(self, *, wait: bool, sleep: Callable[[float], object]) -> StopReason:
        """Run the phases of every stage in order (each phase a kind of ``jobdir.worker.work``), starting
        over when a task found an input refused.  FINISHED once every stage's cluster marker is published.
        A job ``dj-elastic clean`` cleaned keeps only each stage's marker and drop lists: a stage whose
        drop lists check is not looked at further."""
        cleaned = fsio.exists(self.layout.clean_record)
        for _ in range(MAX_PASSES):
            went_back = False
            for stage in self.stages:
                if cleaned and Cluster(self, stage).checked(ROLE_TASK):
                    continue  # a cleaned job's signature and edge files are gone: its drop lists stand
                for phase in PHASES:
                    kind = phase(self, stage)
                    reason = work(kind, wait=wait, sleep=sleep, places=(("job directory", self.layout.root),))
                    if kind.back:
                        went_back = True
                        break
                    if reason is not StopReason.FINISHED:
                        return reason
                if went_back:
                    break
            if not went_back:
                return StopReason.FINISHED
        raise IntegrityError(
            f"the deduplication phases' files kept being refused ({MAX_PASSES} passes)",
            where=str(self.layout.dedup_dir),
            hint="check the job directory's storage; remove the dedup directory to compute them afresh",
        )

    def drops(self, task_id: str, below: int | None = None) -> dict[int, np.ndarray]:
        """Stage -> the shard's input rows it drops, for every stage (``below``: those before that stage),
        each drop list checked (IntegrityError when refused)."""
        return {
            stage.number: clusters.read_drops(
                self.layout.dedup_drops(stage.number, task_id),
                identity=stage_identity(self.manifest.recipe_hash, stage),
                shard=self.index[task_id],
            )
            for stage in self.stages
            if below is None or stage.number < below
        }

    def shard_drops(self, task_id: str) -> dict[int, np.ndarray]:
        """A shard's drop lists for its run; one refused is set aside and the phases run again first."""
        for _ in range(MAX_PASSES):
            paths = {self.layout.dedup_drops(stage.number, task_id) for stage in self.stages}
            try:
                with reading_inputs(paths, "shard"):
                    return self.drops(task_id)
            except IntegrityError as exc:
                if not input_refused(exc):
                    raise
            self.work(wait=True, sleep=_sleeper(self.stop_event))
        raise IntegrityError(f"the drop lists of {task_id} kept being refused", where=str(self.layout.dedup_dir))


def _sleeper(stop_event) -> Callable[[float], object]:
    return stop_event.wait if stop_event is not None else time.sleep


def dedup_phases(run_signatures: RunSignatures | None):
    """What ``jobdir.worker.run_worker`` takes as ``phases``: given the job, its :class:`DedupPhases`
    (None when its recipe holds no deduplicator)."""

    def build(layout: JobLayout, manifest: Manifest, queue_of, *, poll_secs: float, stop_event=None):
        stages = dedup_stages(manifest.recipe.get("process") or [])
        if not stages:
            return None
        if run_signatures is None:
            raise ConfigError(
                f"the job's recipe deduplicates (process[{stages[0].position}] {stages[0].op_name}) and this "
                "worker has no signature runner",
                where=str(layout.root),
            )
        return DedupPhases(
            layout, manifest, stages, run_signatures, queue_of, poll_secs=poll_secs, stop_event=stop_event
        )

    return build
