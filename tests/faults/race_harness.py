"""Shared machinery of the multi-process fault tests (rows 7 and 8 of the fault matrix).

Real worker processes run the real worker loop (``run_worker``) with a trivial shard
processor (no Ray).  Each appends its history (claims with their takeover reason,
outputs, publications and their outcome) to its own append-only file, one ``write()``
per line.  :class:`Chaos` starts, SIGKILLs (and replaces) and SIGSTOPs/SIGCONTs them and
always reaps what it started; :func:`check_exactly_once` judges a finished job from the
histories and the job directory.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.layout import JobLayout, parse_gen_name
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job
from data_juicer_elastic.sharedfs import fsio

WORKER = textwrap.dedent(
    """
    import dataclasses, json, os, random, sys, time
    from pathlib import Path
    from data_juicer_elastic.jobdir import attempts
    from data_juicer_elastic.sharedfs.identity import WorkerIdentity
    from data_juicer_elastic.jobdir.layout import JobLayout
    from data_juicer_elastic.jobdir.records import Claim
    from data_juicer_elastic.jobdir.attempts import ShardOutput
    from data_juicer_elastic.jobdir.worker import run_worker
    from data_juicer_elastic.jobdir.worker import WorkerSettings
    from data_juicer_elastic.jobdir.records import Claim
    from data_juicer_elastic.jobdir.attempts import ShardOutput
    from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
    from data_juicer_elastic.rows.shard_source import iter_source_lines

    job, history, node, remote, ttl, heartbeat, max_retries, work_secs = sys.argv[1:9]
    layout = JobLayout(job)
    fd = os.open(history, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(event, **fields):
        # one write() per line on an O_APPEND file: a SIGKILL can lose a line, never tear one
        os.write(fd, (json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **fields}) + "\\n").encode())

    me = WorkerIdentity.current(node)
    if remote == "1":  # another node: nobody here may judge our pid; only the TTL rule applies
        me = dataclasses.replace(me, boot_id=f"remote-{node}-{os.getpid()}")
    rng = random.Random(os.getpid())

    def process(task):
        claim = Claim.parse(layout.claim(task.shard_id, task.generation).read_bytes(), "claim")
        log("claim", shard=task.shard_id, generation=task.generation, attempt=task.attempt_id,
            reason=claim.takeover_reason, takeover_of=claim.takeover_of)
        rows = [json.loads(line) for line in iter_source_lines(task.source)]
        time.sleep(rng.uniform(0.0, float(work_secs)))
        body = "".join(json.dumps({**r, "by": task.attempt_id}) + "\\n" for r in rows)
        out = task.attempt_dir / "output.jsonl"
        out.write_text(body, encoding="utf-8")
        log("output", shard=task.shard_id, generation=task.generation, attempt=task.attempt_id, rows=len(rows))
        return ShardOutput(out, len(rows))

    real_publish = attempts.publish_done

    def logged_publish(layout, claim, output_path, **kw):
        log("publish-begin", shard=claim.shard_id, generation=claim.generation, attempt=claim.attempt_id)
        outcome = real_publish(layout, claim, output_path, **kw)
        log("publish", shard=claim.shard_id, generation=claim.generation, attempt=claim.attempt_id,
            accepted=outcome.accepted, winner=outcome.winner.attempt_id if outcome.winner else None)
        return outcome

    attempts.publish_done = logged_publish  # the worker loop calls it through the module
    log("start", node=node, remote=remote == "1")
    settings = WorkerSettings(ttl_secs=float(ttl), heartbeat_secs=float(heartbeat),
                              max_retries=int(max_retries), poll_interval_secs=0.05)
    summary = run_worker(job, me, process, settings)
    log("exit", done=summary.done, discarded=summary.discarded, lost=summary.lost, failed=summary.failed,
        complete=summary.complete, stop_reason=summary.stop_reason)
    """
)


def prepare(tmp: Path, job: Path, shards: int, rows_per_shard: int = 5) -> list[dict]:
    rows = [{"id": i, "text": f"row {i}"} for i in range(shards * rows_per_shard)]
    data = tmp / "input.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    prepare_job(PrepareRequest(job, data, shards, recipe={"process": []}, stage_identities=[]))
    return rows


@dataclass(frozen=True)
class Lease:
    ttl: float
    heartbeat: float
    # Generous: every kill of a holder is one failure record of its shard (by design: a shard
    # that kills its worker every time must stop); chaos must not exhaust a budget.
    max_retries: int = 1000
    work_secs: float = 0.08  # each shard sleeps uniform(0, work_secs)


class Chaos:
    """Worker slots: start, SIGKILL (and replace), SIGSTOP/SIGCONT; always reaps what it started."""

    def __init__(self, tmp: Path, jobs: list[Path], lease: Lease, seed: int):
        """``jobs[slot % len(jobs)]`` is the job directory path (view) slot ``slot`` uses."""
        self.tmp, self.jobs, self.lease, self.rng = tmp, jobs, lease, random.Random(seed)
        self.script = tmp / "race_worker.py"
        self.script.write_text(WORKER)
        self.histories = tmp / "histories"
        self.histories.mkdir()
        self.procs: dict[int, subprocess.Popen] = {}
        self.history_of: dict[int, Path] = {}
        self.incarnations = collections.Counter()
        self.stopped: dict[int, float] = {}  # slot -> when to SIGCONT
        self.kills = self.stops = self.zombie_stops = 0
        self.faulted: set[tuple[str, int]] = set()  # (shard, generation) held by a killed or paused worker

    def start(self, slot: int) -> None:
        self.incarnations[slot] += 1
        history = self.histories / f"slot{slot:02d}-{self.incarnations[slot]}.jsonl"
        self.history_of[slot] = history
        remote = "1" if slot % 2 else "0"
        with open(self.tmp / f"slot{slot:02d}.err", "ab") as errors:
            self.procs[slot] = subprocess.Popen(
                [sys.executable, str(self.script), str(self.jobs[slot % len(self.jobs)]), str(history), f"n{slot}",
                 remote, str(self.lease.ttl), str(self.lease.heartbeat), str(self.lease.max_retries),
                 str(self.lease.work_secs)],
                stdout=subprocess.DEVNULL, stderr=errors,
            )  # fmt: skip

    def holding(self, slot: int) -> bool:
        """The slot's last logged event is a claim: it is inside an attempt now."""
        try:
            lines = self.history_of[slot].read_bytes().splitlines()
        except FileNotFoundError:
            return False
        return bool(lines) and b'"event": "claim"' in lines[-1]

    def held_by(self, pid: int) -> set[tuple[str, int]]:
        """(shard, generation) of the latest claims ``pid`` made and never ended (no release,
        failure record or done marker): with claim-ahead (jobdir.claiming) a worker holds the
        shard it runs (logged) and up to one more, claimed ahead and not run (not logged)."""
        layout = JobLayout(self.jobs[0])
        held = set()
        for shard in fsio.list_names(layout.claims_dir):
            gens = [g for g in map(parse_gen_name, fsio.list_names(layout.claim_dir(shard))) if g is not None]
            if not gens:
                continue
            gen = max(gens)
            try:
                claim = json.loads(layout.claim(shard, gen).read_bytes())
            except (OSError, ValueError):
                continue
            ended = layout.release(shard, gen).exists() or layout.failure(shard, gen).exists()
            if claim.get("pid") == pid and not ended and not layout.done(shard).exists():
                held.add((shard, gen))
        return held

    def step(self, kill_budget: int, stop_budget: int, victims: set[int] | None = None) -> None:
        now = time.monotonic()
        for slot, until in list(self.stopped.items()):
            if now >= until:
                os.kill(self.procs[slot].pid, signal.SIGCONT)
                del self.stopped[slot]
        live = [s for s, p in self.procs.items() if p.poll() is None and s not in self.stopped]
        holders = [s for s in live if self.holding(s) and (victims is None or s in victims)]
        if not holders:
            return
        slot = self.rng.choice(holders)
        victim = json.loads(self.history_of[slot].read_bytes().splitlines()[-1])
        if self.kills < kill_budget and (self.stops >= stop_budget or self.rng.random() < 0.6):
            self.procs[slot].kill()
            self.procs[slot].wait()  # reaped: the pid is gone (the same-host rule may see it)
            self.kills += 1
            self.faulted.add((victim.get("shard"), victim.get("generation")))
            self.faulted |= self.held_by(self.procs[slot].pid)  # and a shard it held ahead
            self.start(slot)
        elif self.stops < stop_budget:
            pause = self.rng.uniform(0.3, 2.5) * self.lease.ttl
            os.kill(self.procs[slot].pid, signal.SIGSTOP)
            self.stopped[slot] = now + pause
            self.stops += 1
            self.faulted.add((victim.get("shard"), victim.get("generation")))
            time.sleep(0.01)  # the stop is delivered: nothing it holds changes now
            self.faulted |= self.held_by(self.procs[slot].pid)
            self.zombie_stops += pause > self.lease.ttl

    def reap(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def run(
        self,
        processes: int,
        kill_budget: int,
        stop_budget: int,
        chaos_until: float,
        timeout: float = 300,
        victims: set[int] | None = None,
    ) -> float:
        """Start ``processes`` workers, inject faults until ``chaos_until`` of the shards are done,
        then let every worker finish (paused ones still sleep their full pause); seconds taken."""
        layout = JobLayout(self.jobs[0])
        shards = load_manifest(layout.root).num_shards
        started = time.monotonic()
        try:
            for slot in range(processes):
                self.start(slot)
            while done_count(layout) < chaos_until * shards and time.monotonic() - started < timeout:
                if all(p.poll() is not None for p in self.procs.values()):
                    break  # every worker exited early: the checks below say why
                self.step(kill_budget, stop_budget, victims)
                time.sleep(0.05)
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in self.procs.values()) and time.monotonic() < deadline:
                self.step(0, 0)  # no new faults
                time.sleep(0.1)
            running = [s for s, p in self.procs.items() if p.poll() is None]
            assert not running, f"workers still running after the job should have finished: slots {running}"
            codes = {s: p.returncode for s, p in self.procs.items()}
            assert set(codes.values()) == {0}, f"worker exit codes {codes}; see {self.tmp}/slot*.err"
        finally:
            self.reap()
        return time.monotonic() - started


def read_histories(directory: Path) -> list[dict]:
    events = []
    for path in sorted(directory.iterdir()):
        for line in path.read_bytes().splitlines():
            try:
                event = json.loads(line)
            except ValueError:  # pragma: no cover - one write() per line cannot tear
                pytest.fail(f"torn history line in {path}: {line[:100]!r}")
            event["history"] = path.name
            events.append(event)
    return events


def done_count(layout: JobLayout) -> int:
    return sum(1 for n in fsio.list_names(layout.done_dir) if n.endswith(".json") and not n.startswith("."))


@dataclass(frozen=True)
class RaceStats:
    claims: int  # claim files in the job directory
    logged_claims: int  # claims whose attempt started (a SIGKILL can come before the log line)
    takeovers: dict[str, int]  # generation > 1 claims by takeover reason
    stale_takeovers: list[tuple[str, int]]  # (shard, generation taken over) for reason "stale"
    discarded: int  # publications that lost to an earlier one
    lost: int  # attempts abandoned on a lost lease (self-fencing), from the workers' exit lines
    processes: int


def check_exactly_once(job: Path, histories: Path, rows: list[dict], merged: Path) -> RaceStats:
    """Every exactly-once assertion, from the histories and from the job directory."""
    layout = JobLayout(job)
    manifest = load_manifest(job)
    events = read_histories(histories)
    claims = [e for e in events if e["event"] == "claim"]
    winners = collections.Counter((e["shard"], e["generation"]) for e in claims)
    assert max(winners.values()) == 1, f"two claim winners: {[k for k, v in winners.items() if v > 1][:5]}"
    accepted = collections.defaultdict(list)
    for e in events:
        if e["event"] == "publish" and e["accepted"]:
            accepted[e["shard"]].append(e["attempt"])
    assert all(len(v) == 1 for v in accepted.values()), {k: v for k, v in accepted.items() if len(v) > 1}
    outputs = {(e["shard"], e["attempt"]) for e in events if e["event"] == "output"}
    claimed = {(e["shard"], e["attempt"]): e["generation"] for e in claims}

    assert sorted(n for n in fsio.list_names(layout.done_dir) if not n.startswith(".")) == [
        f"{s}.json" for s in manifest.shard_ids
    ], "exactly one done marker per shard and nothing else"
    assert not fsio.list_names(layout.failed_dir), "no shard may fail: the budget is far from spent"
    winner_of = {}
    for shard in manifest.shard_ids:
        result, error = attempts.read_done(layout, shard)
        assert error is None and result is not None
        key = (shard, result.attempt_id)
        assert key in claimed and claimed[key] == result.generation, f"{shard}: accepted attempt never claimed"
        assert key in outputs, f"{shard}: accepted attempt never logged its output"
        # a logged acceptance must be this one (the log line can be lost to a SIGKILL, never wrong)
        assert accepted.get(shard, [result.attempt_id]) == [result.attempt_id]
        winner_of[shard] = result.attempt_id
    merge_job(job, merged)
    out = [json.loads(line) for line in merged.read_bytes().splitlines()]
    assert sorted((r["id"], r["text"]) for r in out) == sorted((r["id"], r["text"]) for r in rows), "multiset"
    assert [r["id"] for r in out] == [r["id"] for r in rows], "merge order is manifest order"
    by_shard = [e.shard_id for e in manifest.shards for _ in range(e.rows)]
    assert [r["by"] for r in out] == [winner_of[s] for s in by_shard], "every row from its accepted attempt"

    gens = [g for s in manifest.shard_ids for g in map(parse_gen_name, fsio.list_names(layout.claim_dir(s))) if g]
    exits = [e for e in events if e["event"] == "exit"]
    return RaceStats(
        claims=len(gens),
        logged_claims=len(claims),
        takeovers=dict(collections.Counter(e["reason"] for e in claims if e["generation"] > 1)),
        stale_takeovers=sorted((e["shard"], e["takeover_of"]) for e in claims if e["reason"] == "stale"),
        discarded=sum(1 for e in events if e["event"] == "publish" and not e["accepted"]),
        lost=sum(e["lost"] for e in exits),
        processes=len({e["history"] for e in events}),
    )
