"""Scale: metadata operations per claim, idle poll, gate, status, exit and heartbeat, counted.

The real ``run_worker`` runs in threads, one thread per worker identity (distinct node ids,
hostnames and pids, so no worker judges another's pid), on a job of one-row shards prepared
with the real ``prepare_job`` (fsync off while building; the built job is copied for each
run), with a trivial ``run_shard`` that copies the shard's rows, and
the straggler gate built as the executor builds it.  No Ray.  Every metadata operation is
counted through the fault seam (``sharedfs.fault_seam``; the scale model's unit: one fsio
call, ``makedirs`` = 3, data writes 0), per thread (each thread keeps its own counts; threads
a worker starts, its heartbeater's and its claim-ahead helper's, count for that worker) and
per activity:

  claim      inside ``claim_next`` (the worker's thread or its claim-ahead helper), gate excluded
  race       on the summary, a probe of a shard shown free that another worker took or finished
             since the summary's round (the claimer moves on to the next shard)
  walk       the same as claim, for a claim made while the worker had no summary it trusted yet (the walk
             it falls back to: a worker's first claims, before it has seen the summary advance);
             counted apart so how many claims come before the first round, a matter of timing on
             a loaded machine, does not change the claim path's cost on the summary
  gate       inside ``ClaimGate.__call__``
  heartbeat  inside ``Heartbeater.beat`` (the first beat runs in the worker's thread, the rest in
             the renewal thread), with the progress flush it triggers
  exit       the job's outcome at the end of ``run_worker`` (``leaving_outcome`` from the summary
             where the code has one, else ``job_outcome``)
  shard      the fake ``run_shard`` (reading the shard's input)
  run        everything else in a worker's thread (attempt records, publication, release)
  ahead      everything else in the claim-ahead helper (the next shard's input check)

Sections (numbers are JSON on stdout's last line and in ``--out``; a table is printed):

  claims     W workers x S shards, claim-ahead on (as the executor runs it) and off:
             ops per claim (claim path, gate included), per shard run, per heartbeat, per exit
  idle       K live claims (10, 100, 300) held by stalled holders (one worker each, TTL 20 s,
             heartbeating and updating progress), every other shard of a 2,000-shard job done
             by 4 finishers: ops per idle poll of a worker that
             finds nothing to claim, ClaimGate ops per evaluation (a node with done shards, the
             tail: no shard is never-claimed), ``dj-elastic status`` ops (the snapshot the CLI
             prints, ``status_document``, in-process), a stopped worker's exit, ``wait_settled``
             ops per poll, and the holders' ops per heartbeat
  status     ``dj-elastic status`` of the finished claims job (S done, 0 running)

With the job summary (``jobdir.roles``) each worker's keeper thread counts as
"keeper", and its rounds are counted as the writer's or another process's look.  A thread
started while a worker does something (status's reader pool) counts for that activity.
One limit of threads: the job summary's reader is registered per process and job
(``job_summary.register_reader``), so the gate, ``wait_settled`` and the exit of every worker
thread read through the last registered one, whose cached view (0.5 s) they share; in a real
deployment each process has its own, and those counts can be up to one ``summary/summary.seq``
read higher per call.

    python benchmarks/bench_scale.py --out /tmp/dje-scale.json    # 15-25 min on 2 shared cores
    python benchmarks/bench_scale.py --reuse --sections status,idle   # the idle runs alone, ~8 min

Most of the time is building the 20,000-shard job (1-1.5 min), 128 workers each loading its
manifest (1-2.5 min per claims run), the claims themselves (2-4 min each) and the idle runs'
hundreds of holder threads; a smaller ``--shards`` / ``--held`` is quicker.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import secrets
import shutil
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from loguru import logger

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from data_juicer_elastic.coordination import (  # noqa: E402
    flow,
    stragglers,
)
from data_juicer_elastic.coordination.run import RunCoordinator, RunId  # noqa: E402
from data_juicer_elastic.jobdir import claiming, heartbeats, worker  # noqa: E402  # noqa: E402
from data_juicer_elastic.jobdir.attempts import ShardOutput  # noqa: E402
from data_juicer_elastic.jobdir.layout import JobLayout  # noqa: E402
from data_juicer_elastic.jobdir.manifest import load_manifest  # noqa: E402
from data_juicer_elastic.rows.shard_source import iter_source_lines  # noqa: E402
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job  # noqa: E402
from data_juicer_elastic.sharedfs import fault_seam  # noqa: E402
from data_juicer_elastic.sharedfs.identity import WorkerIdentity  # noqa: E402
from data_juicer_elastic.status.job_view import status_document  # noqa: E402

WEIGHT = {"makedirs": 3, "write": 0}
IDLE_POLL = ("claim", "race", "walk", "gate")  # an idle worker's polls, walking ones included (GAPS in the model)
IDLE_THREAD = (*IDLE_POLL, "run")


# -- counting ------------------------------------------------------------------------------------------
class Counts:
    """Weighted ops per (owner, activity), each thread counting into its own Counter (no lock on
    the hot path); the owner and the base activity of a thread are set when it starts."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.all: list[tuple[threading.Thread, Counter]] = []
        self.events: list[Counter] = []  # per thread: claims made, claim_next calls, beats, polls
        self.rounds: dict[str, list[int]] = {"writer": [], "other": []}  # a keeper round's ops, each
        self.epoch = 0  # reset() counts up: a round that a reset cut in two is no sample

    def mine(self) -> threading.local:
        tl = self.local
        if not hasattr(tl, "ops"):
            tl.ops, tl.ev, tl.stack = Counter(), Counter(), []
            with self.lock:
                self.all.append((threading.current_thread(), tl.ops))
                self.events.append(tl.ev)
        return tl

    def hook(self, op: str, path: Path) -> None:
        tl = self.mine()
        thread = threading.current_thread()
        activity = tl.stack[-1] if tl.stack else getattr(thread, "bench_activity", thread.name)
        tl.ops[(getattr(thread, "bench_owner", thread.name), activity)] += WEIGHT.get(op, 1)

    def event(self, name: str, n: int = 1) -> None:
        self.mine().ev[(getattr(threading.current_thread(), "bench_owner", "main"), name)] += n

    def total(self, activities=None, owners=None) -> int:
        with self.lock:
            return sum(
                v
                for _, ops in self.all
                for (owner, act), v in list(ops.items())
                if (activities is None or act in activities) and (owners is None or owner in owners)
            )

    def events_total(self, name: str, owners=None) -> int:
        with self.lock:
            return sum(
                v
                for ev in self.events
                for (o, n), v in list(ev.items())
                if n == name and (owners is None or o in owners)
            )

    def by_activity(self, owners=None) -> dict[str, int]:
        out: Counter = Counter()
        with self.lock:
            for _, ops in self.all:
                for (owner, act), v in list(ops.items()):
                    if owners is None or owner in owners:
                        out[act] += v
        return dict(out)

    def reset(self) -> None:
        with self.lock:
            for _, ops in self.all:
                ops.clear()
            for ev in self.events:
                ev.clear()
            for samples in self.rounds.values():
                samples.clear()
            self.epoch += 1


COUNTS = Counts()


class activity:  # noqa: N801 - a context manager named like the activity it marks
    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        COUNTS.mine().stack.append(self.name)

    def __exit__(self, *exc):
        COUNTS.mine().stack.pop()


_PATCHED: list[tuple[object, str, object]] = []  # (object, attribute, original): what uninstall() restores


def _wrap(owner_obj, attr: str, name: str, after=None) -> None:
    original = getattr(owner_obj, attr)
    if getattr(original, "bench_wrapped", False):
        return
    _PATCHED.append((owner_obj, attr, original))

    def wrapped(*args, **kwargs):
        with activity(name):
            result = original(*args, **kwargs)
        if after is not None:
            after(result)
        return result

    wrapped.bench_wrapped = True
    setattr(owner_obj, attr, wrapped)


def _claimed(result) -> None:
    COUNTS.event("claim_calls")
    got = result[0] if isinstance(result, tuple) else result
    if got is not None:
        COUNTS.event("claims")


def install() -> None:
    """Mark the activities (idempotent).  Threads inherit their starter's owner; a heartbeat
    renewal thread counts as heartbeat, a claim-ahead helper as ahead."""
    if getattr(threading.Thread.start, "bench_wrapped", False):
        return
    start = threading.Thread.start

    def thread_start(self, *a, **kw):
        parent = threading.current_thread()
        self.bench_owner = getattr(parent, "bench_owner", parent.name)
        if self.name.startswith("heartbeat"):
            self.bench_activity = "heartbeat"
        elif "ahead" in self.name:
            self.bench_activity = "ahead"
        elif "summary" in self.name:  # the job summary's keeper thread (one per worker process)
            self.bench_activity = "keeper"
        else:  # a helper thread (status's readers, say) counts for what its starter is doing now
            stack = getattr(COUNTS.local, "stack", None)
            self.bench_activity = stack[-1] if stack else getattr(parent, "bench_activity", self.name)
        return start(self, *a, **kw)

    thread_start.bench_wrapped = True
    _PATCHED.append((threading.Thread, "start", start))
    threading.Thread.start = thread_start
    if _summary_keeper() is not None:
        _split_walking_claims()  # inside the activity "claim" that _wrap marks
    _wrap(claiming.Claimer, "claim_next", "claim", after=_claimed)
    _wrap(stragglers.ClaimGate, "__call__", "gate", after=lambda r: COUNTS.event("gate_calls"))
    _wrap(heartbeats.Heartbeater, "beat", "heartbeat", after=lambda r: COUNTS.event("beats"))
    # what run_worker calls as it leaves: the job's outcome (from the summary, where there is one)
    _wrap(worker, "leaving_outcome" if hasattr(worker, "leaving_outcome") else "job_outcome", "exit")
    keeper = _summary_keeper()
    if keeper is not None:
        _wrap_tick(keeper)


def _claim_key() -> tuple[str, str]:
    thread = threading.current_thread()
    return getattr(thread, "bench_owner", thread.name), "claim"


def _claim_ops(tl) -> int:
    return tl.ops[_claim_key()]


def _move_claim_ops(tl, before: int, activity: str) -> None:
    """What this thread counted as "claim" since ``before`` counts as ``activity`` instead."""
    key = _claim_key()
    moved = tl.ops[key] - before
    tl.ops[key] -= moved
    tl.ops[(key[0], activity)] += moved


def _split_walking_claims() -> None:
    """A claim made without a trusted summary (its claimer never looked at one) moves its ops, the
    pace record written after it included, from "claim" to "walk" and counts as a walking claim.
    On the summary, a probe of a shard the summary showed free that another worker had taken or
    finished since (the summary is a round behind) moves its ops to "race": the model charges
    those races apart, and how many there are depends on how fast shards go by a round."""
    learn, claim_next = claiming.Claimer._learn_summary, claiming.Claimer.claim_next
    probe = claiming.Claimer._probe
    _PATCHED.append((claiming.Claimer, "_learn_summary", learn))
    _PATCHED.append((claiming.Claimer, "_probe", probe))
    _PATCHED.append((claiming.Claimer, "claim_next", claim_next))

    def learning(self, view):
        COUNTS.mine().on_summary = True
        return learn(self, view)

    def probing(self, entry, vouched=None):
        tl = COUNTS.mine()
        if getattr(tl, "probing", False) or not getattr(tl, "on_summary", False):
            return probe(self, entry, vouched)
        before, tl.probing = _claim_ops(tl), True
        try:
            outcome = probe(self, entry, vouched)
        finally:
            tl.probing = False
        if outcome in (claiming.BUSY, claiming.SURPRISE):
            _move_claim_ops(tl, before, "race")
            COUNTS.event("races")
        return outcome

    def claiming_next(self):
        tl = COUNTS.mine()
        tl.on_summary = False
        before = _claim_ops(tl)
        got, finished = claim_next(self)
        if not tl.on_summary:
            _move_claim_ops(tl, before, "walk")
            if got is not None:
                COUNTS.event("walking_claims")
        return got, finished

    claiming.Claimer._learn_summary = learning
    claiming.Claimer._probe = probing
    claiming.Claimer.claim_next = claiming_next


def _summary_keeper():
    """The job summary's keeper class, where the code has one (None: the walk, no summary)."""
    try:
        return importlib.import_module("data_juicer_elastic.jobdir.roles").SummaryKeeper
    except ImportError:
        return None


def _wrap_tick(keeper_cls) -> None:
    """A keeper round counts as "keeper", and as a writer's round or another process's look."""
    original = keeper_cls.tick
    _PATCHED.append((keeper_cls, "tick", original))

    def tick(self, *args, **kwargs):
        # the keeper's own thread and the reader threads it starts (they count as its "keeper")
        owner = {getattr(threading.current_thread(), "bench_owner", threading.current_thread().name)}
        before, rounds, epoch = COUNTS.total({"keeper"}, owners=owner), self.rounds, COUNTS.epoch
        with activity("keeper"):
            try:
                return original(self, *args, **kwargs)
            finally:
                ops = COUNTS.total({"keeper"}, owners=owner) - before
                kind = "writer" if self.writing else "other"
                COUNTS.event(f"{kind}_ticks")
                COUNTS.event(f"{kind}_tick_ops", ops)
                # the rounds the model prices: a writer's round that composed and published a summary
                # (not one that found its lease lost or taken first), another keeper's look
                with COUNTS.lock:
                    if COUNTS.epoch == epoch and (kind == "other" or self.rounds != rounds):
                        COUNTS.rounds[kind].append(ops)

    keeper_cls.tick = tick


def uninstall() -> None:
    while _PATCHED:
        obj, attr, original = _PATCHED.pop()
        setattr(obj, attr, original)


# -- building --------------------------------------------------------------------------------------
def build_job(base: Path, shards: int) -> Path:
    """A job of ``shards`` one-row shards (prepare + scans in-process, fsync off while building)."""
    base.mkdir(parents=True, exist_ok=True)
    data = base / "input.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(shards)))
    real_fsync = os.fsync
    os.fsync = lambda fd: None
    try:
        prepare_job(
            PrepareRequest(
                job_dir=base / "job", dataset_path=data, num_shards=shards, recipe={"process": []},
                stage_identities=["bench"],
            )
        )  # fmt: skip
    finally:
        os.fsync = real_fsync
    return base / "job"


def copy_job(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True)
    return dst


_BOOT = secrets.token_hex(8)


def identity(k: int, kind: str = "w") -> WorkerIdentity:
    """A worker identity of its own: node, host and pid namespace differ from every other one."""
    return WorkerIdentity(
        node_id=f"{kind}{k}", hostname=f"bench-{kind}{k}.{socket.gethostname()}", boot_id=_BOOT,
        pid=100_000 + (hash(kind) % 1000) * 1000 + k, pid_namespace=f"pid:[bench-{kind}{k}]",
    )  # fmt: skip


SHARD_SLEEP = [0.0]  # seconds each claims-run shard takes on top of copying its row (--shard-sleep)


def copy_rows(task) -> ShardOutput:
    with activity("shard"):
        data = b"".join(line + b"\n" for line in iter_source_lines(task.source))
    if SHARD_SLEEP[0]:
        time.sleep(SHARD_SLEEP[0])
    task.output_path.write_bytes(data)
    return ShardOutput(task.output_path, data.count(b"\n"))


def run_worker(job: Path, ident: WorkerIdentity, run_shard, settings: dict, **kwargs):
    """``worker.run_worker`` with these settings, as one ``WorkerSettings``."""
    return worker.run_worker(job, ident, run_shard, worker.WorkerSettings(**settings), **kwargs)


def _gate(job: Path, ident: WorkerIdentity, poll: float) -> stragglers.ClaimGate:
    return stragglers.ClaimGate(JobLayout(job), load_manifest(job), ident.node_id, ident.pid, min_interval=poll)


def _worker_thread(name: str, fn, *args, **kwargs) -> threading.Thread:
    """A thread that is its own owner from its first op on."""

    def body():
        me = threading.current_thread()
        me.bench_owner, me.bench_activity = name, "run"
        fn(*args, **kwargs)

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    return thread


# -- section: claims ---------------------------------------------------------------------------------
def run_claims(job: Path, workers: int, *, claim_ahead: bool, poll: float, ttl: float, hb: float) -> dict:
    COUNTS.reset()
    go = threading.Barrier(workers + 1)
    summaries: dict[str, object] = {}
    errors: list[BaseException] = []

    def one(k: int) -> None:
        ident = identity(k)
        gate = _gate(job, ident, poll)
        go.wait()
        try:
            summaries[ident.node_id] = run_worker(
                job, ident, copy_rows, dict(ttl_secs=ttl, heartbeat_secs=hb, max_retries=2, poll_interval_secs=poll,
                claim_ahead=claim_ahead), claim_gate=gate,
            )  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - reported by the driver
            errors.append(exc)

    threads = [_worker_thread(f"w{k}", one, k) for k in range(workers)]
    fault_seam.set_fault_hook(COUNTS.hook)
    t0 = time.perf_counter()
    go.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    fault_seam.set_fault_hook(None)
    if errors:
        raise errors[0]
    shards = len(load_manifest(job).shards)
    done = sum(s.done for s in summaries.values())
    assert done == shards and all(s.complete for s in summaries.values()), (done, shards)
    claims = COUNTS.events_total("claims")
    walking = COUNTS.events_total("walking_claims")
    acts = COUNTS.by_activity()
    beats = COUNTS.events_total("beats")
    return {
        "workers": workers,
        "shards": shards,
        "claim_ahead": claim_ahead,
        "wall_s": round(wall, 1),
        "claims": claims,
        "claim_next_calls": COUNTS.events_total("claim_calls"),
        "gate_calls": COUNTS.events_total("gate_calls"),
        "claims_per_s": round(claims / wall, 1),
        # on the summary: the claims made with one (the walking ones apart, below); the gate over all
        "claim_path_ops_per_claim": round(
            acts.get("claim", 0) / max(claims - walking, 1) + acts.get("gate", 0) / claims, 2
        ),
        "walking_claims": walking,
        "races": COUNTS.events_total("races"),
        "race_ops_per_race": round(acts.get("race", 0) / max(COUNTS.events_total("races"), 1), 2),
        "walking_claim_ops_per_claim": round(acts.get("walk", 0) / walking, 2) if walking else None,
        "gate_ops_per_claim": round(acts.get("gate", 0) / claims, 2),
        "run_ops_per_shard": round((acts.get("run", 0) + acts.get("ahead", 0)) / shards, 2),
        "shard_ops_per_shard": round(acts.get("shard", 0) / shards, 2),
        "beats": beats,
        "heartbeat_ops_per_beat": round(acts.get("heartbeat", 0) / max(beats, 1), 2),
        "exit_ops_per_worker": round(acts.get("exit", 0) / workers, 2),
        "all_ops_per_shard": round(sum(acts.values()) / shards, 2),
        **keeper_stats(),
        "ops_by_activity": acts,
        "shards_by_worker_max_min": [max(s.done for s in summaries.values()), min(s.done for s in summaries.values())],
    }


def keeper_stats() -> dict:
    """The job summary's rounds since the last reset: the writer's (ops per round) and the other
    processes' (each keeper looks whether the writer is alive and flushes its pace record)."""
    out = {}
    for kind in ("writer", "other"):
        ticks = COUNTS.events_total(f"{kind}_ticks")
        with COUNTS.lock:
            samples = list(COUNTS.rounds[kind])
        out[f"{kind}_rounds"] = ticks
        out[f"{kind}_round_ops_mean"] = round(COUNTS.events_total(f"{kind}_tick_ops") / ticks, 2) if ticks else None
        out[f"{kind}_round_samples"] = samples
        # the median whole round: a round that a concurrent flush or the machine's load made dearer
        # is one sample of many, not a shift of the whole measurement
        out[f"{kind}_round_ops"] = statistics.median(samples) if samples else None
    return out


# -- section: idle (K live claims held by stalled holders) ---------------------------------------------
def _timed(fn) -> tuple[object, float]:
    t = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t


def run_idle(job: Path, held: int, *, finishers: int, polls: int, poll: float, ttl: float, hb: float) -> dict:
    """``held`` holders each claim one shard and keep it (heartbeating, progress changing); the
    finishers complete every other shard; then the measurements, each counted on its own."""
    layout, manifest = JobLayout(job), load_manifest(job)
    release = threading.Event()
    running = threading.Semaphore(0)
    errors: list[BaseException] = []

    def hold(task) -> ShardOutput:
        running.release()
        tracker, n = heartbeats.current(), 0
        while not release.wait(hb / 2):
            n += 1
            if tracker is not None:
                tracker.update(rows_read=n % 2, rows_written=0)  # a sign of life: every beat flushes
        return copy_rows(task)

    def holder(k: int) -> None:
        try:
            run_worker(
                job, identity(k, "h"), hold, dict(ttl_secs=ttl, heartbeat_secs=hb, max_retries=2,
                poll_interval_secs=poll, max_shards=1, claim_ahead=False, wait_for_completion=False),
            )  # fmt: skip
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    holders = [_worker_thread(f"h{k}", holder, k) for k in range(held)]
    for _ in range(held):
        if not running.acquire(timeout=300):
            raise RuntimeError(f"holders did not all start: {errors}")

    def finisher(k: int) -> None:
        run_worker(
            job, identity(k, "f"), copy_rows, dict(ttl_secs=ttl, heartbeat_secs=hb, max_retries=2,
            poll_interval_secs=poll, claim_ahead=False, wait_for_completion=False),
        )  # fmt: skip

    for t in [_worker_thread(f"f{k}", finisher, k) for k in range(finishers)]:
        t.join()
    done = len(os.listdir(layout.done_dir))
    out: dict = {"held": held, "done": done, "shards": len(manifest.shards), "poll_s": poll, "ttl_s": ttl}

    # 1. an idle worker: nothing to claim; ops per poll (its claim path), then its exit when stopped
    fault_seam.set_fault_hook(COUNTS.hook)
    COUNTS.reset()
    stop = threading.Event()
    per_poll: list[int] = []
    marks = [0]
    idle_ident = identity(0, "i")

    per_poll_all: list[int] = []

    def counted_sleep(secs: float) -> None:
        now = COUNTS.total(IDLE_POLL, owners={"i0"})
        per_poll.append(now - marks[0])
        marks[0] = now
        everything = COUNTS.total(IDLE_THREAD, owners={"i0"})  # the worker's own thread: + its pace record
        per_poll_all.append(everything - sum(per_poll_all))
        if len(per_poll) >= polls:
            stop.set()
        stop.wait(secs)

    def idle() -> None:
        summary = run_worker(
            job, idle_ident, copy_rows, dict(ttl_secs=ttl, heartbeat_secs=hb, max_retries=2, poll_interval_secs=poll),
            claim_gate=_gate(job, idle_ident, poll), stop_event=stop, sleep=counted_sleep,
        )  # fmt: skip
        out["idle_claimed"] = summary.claimed

    _worker_thread("i0", idle).join()
    later = per_poll[1:] or per_poll
    out["idle_first_poll_ops"] = per_poll[0]
    out["idle_poll_ops_median"] = statistics.median(later)
    out["idle_poll_ops_mean"] = round(statistics.fmean(later), 2)
    out["idle_poll_ops_max"] = max(later)
    out["idle_polls"] = len(per_poll)
    out["idle_poll_all_ops_median"] = statistics.median(per_poll_all[1:] or per_poll_all)
    out["stopped_exit_ops"] = COUNTS.total({"exit"}, owners={"i0"})

    # 2. the claim gate of a node with done shards, in the tail: ops per evaluation
    COUNTS.reset()
    gate_ident = identity(0, "f")
    clock = itertools.count(0.0, 1e6).__next__  # every call finds its last answer expired
    gate = stragglers.ClaimGate(
        layout, manifest, gate_ident.node_id, gate_ident.pid, min_interval=0.0, max_read_share=None, clock=clock
    )
    gate_ops = []
    for _ in range(8):
        before = COUNTS.total()
        with activity("gate"):
            gate()
        gate_ops.append(COUNTS.total() - before)
    out["gate_ops_first"] = gate_ops[0]
    out["gate_ops_median"] = statistics.median(gate_ops[1:])
    out["gate_ops"] = gate_ops

    # 3. dj-elastic status (text and JSON) in-process, counted
    out.update(count_status(job, ttl))

    # 4. wait_settled (an instance that stopped claiming waits for the others): ops per poll
    COUNTS.reset()
    coordinator = RunCoordinator(layout, RunId("bench", "derived"), identity(1, "i"), ttl_secs=ttl,
                                 heartbeat_secs=hb, poll_secs=poll)  # fmt: skip
    settle_polls: list[int] = []

    class Enough(Exception):
        pass

    def settle_sleep(secs: float) -> None:
        settle_polls.append(COUNTS.total({"settle"}))
        if len(settle_polls) >= 3:
            raise Enough

    with activity("settle"):
        try:
            coordinator.sleep = settle_sleep
            flow.wait_settled(coordinator, manifest, wait_timeout_secs=1e9, strict=None)
        except Enough:
            pass
    diffs = [b - a for a, b in zip([0] + settle_polls, settle_polls, strict=False)]
    out["settle_ops_per_poll"] = statistics.median(diffs)

    # 5. the holders' heartbeats (with their progress flush) over a few intervals
    COUNTS.reset()
    time.sleep(2.2 * hb)
    beats = COUNTS.events_total("beats")
    out["holder_beats"] = beats
    out["heartbeat_ops_per_beat"] = round(COUNTS.total({"heartbeat"}) / max(beats, 1), 2)
    out.update(keeper_stats())
    fault_seam.set_fault_hook(None)

    release.set()
    for t in holders:
        t.join()
    if errors:
        raise errors[0]
    return out


def count_status(job: Path, ttl: float) -> dict:
    """Ops and seconds of ``dj-elastic status`` (text, then JSON) in-process (the fault hook is set)."""
    out = {}
    for as_json in (False, True):
        COUNTS.reset()
        with activity("status"):
            _, secs = _timed(lambda j=as_json: status_document(job, as_json=j, show_all=False, ttl_secs=ttl))
        key = "status_json" if as_json else "status"
        out[f"{key}_ops"], out[f"{key}_s"] = COUNTS.total({"status"}), round(secs, 3)
    return out


def run_status(job: Path, ttl: float) -> dict:
    fault_seam.set_fault_hook(COUNTS.hook)
    out = {"shards": len(load_manifest(job).shards), "done": len(os.listdir(JobLayout(job).done_dir)), "held": 0}
    out.update(count_status(job, ttl))
    fault_seam.set_fault_hook(None)
    return out


# -- driver ----------------------------------------------------------------------------------------
def measure(args: argparse.Namespace) -> dict:
    install()
    logger.disable("data_juicer_elastic")  # 20,000 claims' log lines are not the measurement
    try:
        return _measure(args)
    finally:
        fault_seam.set_fault_hook(None)
        uninstall()
        logger.enable("data_juicer_elastic")


def _built(base: Path, shards: int, reuse: bool) -> Path:
    job = base / "job"
    if reuse and (job / "manifest.json").exists() and len(load_manifest(job).shards) == shards:
        return job
    shutil.rmtree(base, ignore_errors=True)
    return build_job(base, shards)


def _measure(args: argparse.Namespace) -> dict:
    SHARD_SLEEP[0] = args.shard_sleep
    work = args.workdir
    if not args.reuse:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    sections = set(args.sections.split(","))
    result: dict = {"load_before": round(os.getloadavg()[0], 2), "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}  # fmt: skip
    result.update(claims=[], idle=[], status=[], protocol="walk")
    if _summary_keeper() is not None:
        result["protocol"] = "summary"  # the code keeps a job summary (the claims runs confirm it wrote one)
    if "claims" in sections:
        t = time.perf_counter()
        built = _built(work / "built", args.shards, args.reuse)
        result["build_s"] = round(time.perf_counter() - t, 1)
        for ahead in (True, False):
            if ahead and args.no_ahead_only:
                continue
            job = copy_job(built, work / f"claims-{'ahead' if ahead else 'plain'}")
            row = run_claims(job, args.workers, claim_ahead=ahead, poll=args.poll, ttl=args.ttl, hb=args.ttl / 4)
            row["summary_written"] = any(name.startswith("summary") for name in os.listdir(job))
            result["claims"].append(row)
            print(json.dumps(row), flush=True)
    if "claims" in sections or "status" in sections:
        finished = work / "claims-plain"
        if (finished / "manifest.json").exists():
            result["status"].append(run_status(finished, args.ttl))
            print(json.dumps(result["status"][-1]), flush=True)
    if "idle" in sections:
        idle_built = _built(work / "idle-built", args.idle_shards, args.reuse)
        for held in args.held:
            job = copy_job(idle_built, work / f"idle-{held}")
            row = run_idle(job, held, finishers=args.finishers, polls=args.polls, poll=args.idle_poll,
                           ttl=args.idle_ttl, hb=args.idle_ttl / 4)  # fmt: skip
            result["idle"].append(row)
            result["status"].append({k: row[k] for k in ("shards", "done", "held", "status_ops", "status_s",
                                                          "status_json_ops", "status_json_s")})  # fmt: skip
            print(json.dumps(row), flush=True)
    result["load_after"] = round(os.getloadavg()[0], 2)
    return result


def table(r: dict) -> str:
    lines = ["| claims: W x S | claim-ahead | claims/s | claim-path ops/claim | gate ops/claim | run ops/shard "
             "| heartbeat ops/beat | exit ops/worker | writer round ops |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for c in r["claims"]:
        lines.append(
            f"| {c['workers']} x {c['shards']} | {'on' if c['claim_ahead'] else 'off'} | {c['claims_per_s']} "
            f"| {c['claim_path_ops_per_claim']} | {c['gate_ops_per_claim']} | {c['run_ops_per_shard']} "
            f"| {c['heartbeat_ops_per_beat']} | {c['exit_ops_per_worker']} | {c.get('writer_round_ops')} |"
        )
    lines += ["", "| live claims held | done | idle poll ops: first / median / mean / max | gate ops/eval "
              "(first, median) | stopped exit ops | wait_settled ops/poll | heartbeat ops/beat | writer round ops |",
              "|---:|---:|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for i in r["idle"]:
        lines.append(
            f"| {i['held']} | {i['done']} | {i['idle_first_poll_ops']} / {i['idle_poll_ops_median']} / "
            f"{i['idle_poll_ops_mean']} / {i['idle_poll_ops_max']} | {i['gate_ops_first']}, {i['gate_ops_median']} "
            f"| {i['stopped_exit_ops']} | {i['settle_ops_per_poll']} | {i['heartbeat_ops_per_beat']} "
            f"| {i.get('writer_round_ops')} |"
        )
    lines += ["", "| status: shards | done | running | ops (text) | s (text) | ops (json) | s (json) |",
              "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for s in r["status"]:
        lines.append(
            f"| {s['shards']} | {s['done']} | {s['held']} | {s['status_ops']} | {s['status_s']} "
            f"| {s['status_json_ops']} | {s['status_json_s']} |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dje-scale"))
    ap.add_argument("--out", type=Path, help="write the JSON here too")
    ap.add_argument("--workers", type=int, default=128)
    ap.add_argument("--shards", type=int, default=20_000)
    ap.add_argument("--poll", type=float, default=0.5, help="poll interval of the claims runs (and the gate's)")
    ap.add_argument("--ttl", type=float, default=120.0, help="lease TTL of the claims runs (heartbeat TTL/4)")
    ap.add_argument("--shard-sleep", type=float, default=0.0, help="seconds a claims-run shard takes (a small job's "
                    "claims then span several summary rounds)")  # fmt: skip
    ap.add_argument("--no-ahead-only", action="store_true", help="claims run with claim-ahead off only")
    ap.add_argument("--held", type=int, nargs="+", default=[10, 100, 300], help="live claims in the idle runs")
    ap.add_argument("--idle-shards", type=int, default=2000, help="shards of the idle runs' job")
    ap.add_argument("--finishers", type=int, default=4)
    ap.add_argument("--polls", type=int, default=24, help="idle polls measured per run")
    ap.add_argument("--idle-poll", type=float, default=0.5)
    ap.add_argument("--idle-ttl", type=float, default=20.0, help="TTL of the idle runs (heartbeat TTL/4)")
    ap.add_argument("--sections", default="claims,idle", help="claims, idle, status (the finished claims job)")
    ap.add_argument("--reuse", action="store_true", help="keep the work dir and reuse the jobs built there")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    result = measure(args)
    print(table(result))
    text = json.dumps(result)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
