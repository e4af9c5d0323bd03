"""Fault matrix row 7: exactly-once under contention.

Many real worker processes run the real worker loop (``run_worker``) on one job with a
trivial shard processor (no Ray) while a chaos controller SIGKILLs them (and starts
replacements) and SIGSTOPs them for up to ~2.5 TTL before SIGCONT (zombies).  Half of
the workers pretend to be on other nodes (a boot id of their own), so their deaths are
only noticed by the TTL rule; the others die "on this host" and are taken over at once.

Every worker process appends its history (claims, takeovers, outputs, publications and
their outcome) to its own append-only file, one ``write()`` per line.  The test then
checks exactly-once acceptance from those histories and from the job directory:
one claim winner per (shard, generation), at most one accepted publication per shard and
it is the attempt the done marker names, one done marker per shard and nothing else in
``done/``, and the merged output is the input multiset, each row from its shard's
accepted attempt, in manifest order.

CI runs 8 processes x 60 shards; ``DJ_ELASTIC_FULL_MATRIX=1`` runs the issue's
24 processes x 400 shards.  The numbers seen are printed (``pytest -s``).
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
from pathlib import Path

import pytest

from data_juicer_elastic.jobdir import attempts, fsio
from data_juicer_elastic.jobdir.layout import JobLayout, parse_gen_name
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.merge import merge_job
from data_juicer_elastic.jobdir.prepare import PrepareRequest, prepare_job

FULL = os.environ.get("DJ_ELASTIC_FULL_MATRIX") == "1"
PROCESSES, SHARDS = (24, 400) if FULL else (8, 60)
ROWS_PER_SHARD = 5
TTL, HEARTBEAT = 3.0, 0.5
# Generous: every kill of a holder is one failure record of its shard (by design: a shard
# that kills its worker every time must stop); chaos must not exhaust a budget.
MAX_RETRIES = 1000

WORKER = textwrap.dedent(
    """
    import dataclasses, json, os, random, sys, time
    from pathlib import Path
    from data_juicer_elastic.jobdir import attempts
    from data_juicer_elastic.jobdir.identity import WorkerIdentity
    from data_juicer_elastic.jobdir.layout import JobLayout
    from data_juicer_elastic.jobdir.records import Claim
    from data_juicer_elastic.jobdir.tasks import ShardOutput
    from data_juicer_elastic.jobdir.worker_loop import run_worker

    job, history, node, remote, ttl, heartbeat, max_retries = sys.argv[1:8]
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
        rows = [json.loads(line) for line in task.shard_path.read_bytes().splitlines()]
        time.sleep(rng.uniform(0.0, 0.08))
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
    summary = run_worker(job, me, process, ttl_secs=float(ttl), heartbeat_secs=float(heartbeat),
                         max_retries=int(max_retries), poll_interval_secs=0.05)
    log("exit", done=summary.done, discarded=summary.discarded, lost=summary.lost, failed=summary.failed,
        complete=summary.complete, stop_reason=summary.stop_reason)
    """
)


def _prepare(tmp: Path) -> tuple[Path, list[dict]]:
    rows = [{"id": i, "text": f"row {i}"} for i in range(SHARDS * ROWS_PER_SHARD)]
    data = tmp / "input.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    job = tmp / "job"
    prepare_job(PrepareRequest(job, data, SHARDS, recipe={"process": []}, stage_identities=[]))
    return job, rows


class Chaos:
    """Worker slots: start, SIGKILL (and replace), SIGSTOP/SIGCONT; always reaps what it started."""

    def __init__(self, tmp: Path, job: Path, seed: int):
        self.tmp, self.job, self.rng = tmp, job, random.Random(seed)
        self.script = tmp / "race_worker.py"
        self.script.write_text(WORKER)
        self.histories = tmp / "histories"
        self.histories.mkdir()
        self.procs: dict[int, subprocess.Popen] = {}
        self.history_of: dict[int, Path] = {}
        self.incarnations = collections.Counter()
        self.stopped: dict[int, float] = {}  # slot -> when to SIGCONT
        self.kills = self.stops = self.zombie_stops = 0

    def start(self, slot: int) -> None:
        self.incarnations[slot] += 1
        history = self.histories / f"slot{slot:02d}-{self.incarnations[slot]}.jsonl"
        self.history_of[slot] = history
        remote = "1" if slot % 2 else "0"
        with open(self.tmp / f"slot{slot:02d}.err", "ab") as errors:
            self.procs[slot] = subprocess.Popen(
                [sys.executable, str(self.script), str(self.job), str(history), f"n{slot}", remote,
                 str(TTL), str(HEARTBEAT), str(MAX_RETRIES)],
                stdout=subprocess.DEVNULL, stderr=errors,
            )  # fmt: skip

    def holding(self, slot: int) -> bool:
        """The slot's last logged event is a claim: it is inside an attempt now."""
        try:
            lines = self.history_of[slot].read_bytes().splitlines()
        except FileNotFoundError:
            return False
        return bool(lines) and b'"event": "claim"' in lines[-1]

    def step(self, kill_budget: int, stop_budget: int) -> None:
        now = time.monotonic()
        for slot, until in list(self.stopped.items()):
            if now >= until:
                os.kill(self.procs[slot].pid, signal.SIGCONT)
                del self.stopped[slot]
        live = [s for s, p in self.procs.items() if p.poll() is None and s not in self.stopped]
        holders = [s for s in live if self.holding(s)]
        if not holders:
            return
        slot = self.rng.choice(holders)
        if self.kills < kill_budget and (self.stops >= stop_budget or self.rng.random() < 0.6):
            self.procs[slot].kill()
            self.procs[slot].wait()  # reaped: the pid is gone (the same-host rule may see it)
            self.kills += 1
            self.start(slot)
        elif self.stops < stop_budget:
            pause = self.rng.uniform(0.3, 2.5) * TTL
            os.kill(self.procs[slot].pid, signal.SIGSTOP)
            self.stopped[slot] = now + pause
            self.stops += 1
            self.zombie_stops += pause > TTL

    def reap(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _read_histories(directory: Path) -> list[dict]:
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


def _done_count(layout: JobLayout) -> int:
    return sum(1 for n in fsio.list_names(layout.done_dir) if n.endswith(".json") and not n.startswith("."))


def test_exactly_once_under_sigkill_and_sigstop(tmp_path):
    job, rows = _prepare(tmp_path)
    layout = JobLayout(job)
    manifest = load_manifest(job)
    chaos = Chaos(tmp_path, job, seed=7)
    kill_budget, stop_budget = (60, 40) if FULL else (10, 6)
    started = time.monotonic()
    try:
        for slot in range(PROCESSES):
            chaos.start(slot)
        # Chaos while most of the job is still to do; then let the workers finish.
        while _done_count(layout) < 0.85 * SHARDS and time.monotonic() - started < 400:
            if all(p.poll() is not None for p in chaos.procs.values()):
                break  # every worker exited early: the assertions below say why
            chaos.step(kill_budget, stop_budget)
            time.sleep(0.05)
        deadline = time.monotonic() + 300
        while any(p.poll() is None for p in chaos.procs.values()) and time.monotonic() < deadline:
            chaos.step(0, 0)  # no new faults; paused workers still sleep their full pause
            time.sleep(0.1)
        running = [s for s, p in chaos.procs.items() if p.poll() is None]
        assert not running, f"workers still running after the job should have finished: slots {running}"
        codes = {s: p.returncode for s, p in chaos.procs.items()}
        assert set(codes.values()) == {0}, f"worker exit codes {codes}; see {tmp_path}/slot*.err"
    finally:
        chaos.reap()
    elapsed = time.monotonic() - started
    events = _read_histories(chaos.histories)

    # -- from the histories ----------------------------------------------------------------------------
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

    # -- from the job directory --------------------------------------------------------------------------
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
    merged = tmp_path / "merged.jsonl"
    merge_job(job, merged)
    out = [json.loads(line) for line in merged.read_bytes().splitlines()]
    assert sorted((r["id"], r["text"]) for r in out) == sorted((r["id"], r["text"]) for r in rows), "multiset"
    assert [r["id"] for r in out] == [r["id"] for r in rows], "merge order is manifest order"
    by_shard = [e.shard_id for e in manifest.shards for _ in range(e.rows)]
    assert [r["by"] for r in out] == [winner_of[s] for s in by_shard], "every row from its accepted attempt"

    takeovers = collections.Counter(e["reason"] for e in claims if e["generation"] > 1)
    gens = [
        g for s in manifest.shard_ids for g in map(parse_gen_name, fsio.list_names(layout.claim_dir(s))) if g
    ]
    discarded = sum(1 for e in events if e["event"] == "publish" and not e["accepted"])
    exits = [e for e in events if e["event"] == "exit"]
    lost = sum(e["lost"] for e in exits)
    print(
        f"\nrace: {PROCESSES} processes, {SHARDS} shards, {elapsed:.1f}s; SIGKILL {chaos.kills}, "
        f"SIGSTOP {chaos.stops} ({chaos.zombie_stops} longer than TTL); claims {len(gens)} "
        f"(logged {len(claims)}), takeovers by reason {dict(takeovers)}, discarded publications {discarded}, "
        f"lost leases (self-fenced) {lost}, worker processes {sum(chaos.incarnations.values())}"
    )
    assert chaos.kills >= 1 and takeovers, "the chaos must have forced at least one takeover"
