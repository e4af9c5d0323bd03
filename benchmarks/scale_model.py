"""Scale model of the job-summary protocol: W workers, S shards, one NAS of C metadata ops/s.

A deterministic (seeded) discrete-event simulation, standard library only.  It does not run
the plugin: it replays the protocol step by step with the number of metadata operations each
step issues (``OPS``: the protocol's specification, or the counts ``benchmarks/bench_scale.py``
measured, ``--ops-from``; ``check_ops`` compares the two) and sends them to a NAS modelled as

* a fixed per-operation latency ``latency_s`` (a worker issues its operations one after
  another), and
* a metadata capacity ``nas_ops_per_s`` shared by every client (processor sharing: with N
  clients issuing back to back, each gets ``min(1/latency, C_free/N)`` ops/s, where
  ``C_free`` is what the open-loop heartbeats leave).

Unit: one metadata op = one filesystem call through ``sharedfs.fsio`` (open/read of a record,
open-probe of a name, listdir, create, fsync, close, link, replace, unlink, fsync of a
directory); ``makedirs`` counts 3; the bytes of a record are data, not counted.

The protocol (one worker per node):

* One worker is the summary writer.  Every ``summary_s`` it lists ``paces/``, ``done/`` and
  ``failed/``, reads every live worker's pace record and the heartbeat of every live claim, and
  writes ``brief.json.z`` (what workers read), ``summary.json`` (for ``status``) and
  ``summary.seq``; it also renews its writer lease every H = TTL/4.
* A claim reads ``summary.seq`` (and the brief when the seq named a new one), picks a shard the
  summary shows free (at random among them: no ops), probes and publishes it as the claim
  path does (done marker, failure budget, lease, ``link()``), and writes the worker's pace
  record.  A shard claimed since the summary was taken loses the ``link()`` race or shows
  its claim: the worker remembers it and picks another.  With claim-ahead (the executor's
  default) the next shard is claimed when the running one is 80 % through.
* The straggler gate decides from the paces in the summary (no ops): in the tail a node
  declines a shard that the other running nodes will finish sooner.
* A worker with nothing to claim reads only ``summary.seq`` per poll, backing off from
  ``poll_s`` to ``summary_s``; when it changed it reads the summary and tries again.
* The holder heartbeats every H (a probe + an atomic write), the progress flush every other
  beat.  A dead holder's claim is listed as a stale candidate once the writer has seen its
  heartbeat unchanged for a TTL; a taker re-reads the lease, writes the failure record and
  claims it.
* ``status`` reads the summary, every pace record and each running attempt's progress; a
  stopped or aborted instance reads the summary.

Run ``python benchmarks/scale_model.py`` for the W x S table (``--help`` for knobs).
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

# -- metadata operations per step, the protocol's specification ---------------------------------
OPS: dict[str, float] = {
    "seq_read": 1,  # summary.seq: every claim and every idle poll
    "summary_read": 1,  # brief.json.z, when the seq named a new one
    "claim_probe": 5,  # done marker (1), failure budget (2), lease: listdir + probe of gen+1 (2)
    "claim_publish": 10,  # makedirs (3), create fsync close link fsync_dir unlink (6), exists(done) (1)
    "claim_lost": 10,  # the publication that lost the link() race (EEXIST, same_bytes 2)
    "pace_write": 3,  # paces/<worker>.json (atomic write), at each claim and each finished shard
    "gate": 0,  # the straggler gate reads the paces in the summary
    "takeover_probe": 4,  # re-read of a stale candidate's lease (claim, release, failure, heartbeat)
    "takeover_record": 12,  # failure record of the dead holder's generation
    "run": 41,  # per shard: attempt record, input check, fence, publish_done, close, release, progress
    "heartbeat": 4,  # a renewal: probe of gen+1 (1) + atomic write (3), no makedirs
    "first_beat": 7,  # a claim's first beat also makes the heartbeat's directory (makedirs: 3)
    "progress_flush": 3,  # every other heartbeat
    "writer_lists": 3,  # listdir paces/, done/, failed/
    "writer_per_worker": 1,  # read of each live worker's pace record
    "writer_per_claim": 1,  # read of each live claim's heartbeat
    "writer_writes": 9,  # brief.json.z + summary.json + summary.seq (atomic writes)
    "writer_fence": 1,  # before each round: is there a newer generation of the writer's lease?
    "status_base": 2,  # summary.json + the manifest
    "status_per_node": 1,  # each pace record
    "status_per_running": 1,  # each running attempt's progress
    "stopped_exit": 1,  # a stopped / aborted instance reads the summary
}

# The walk the workers fall back to while the summary is not advancing (its writer died and no
# other worker has taken the writer lease yet): the claim path as it is without a summary.
WALK_OPS: dict[str, float] = {
    "walk_claim": 23.0,  # claim path per claim (cursor probe 5, publication 10, gate listings and samples)
    "walk_idle_per_claim": 1.0,  # an idle walk reads each live claim's done marker per poll ...
    "walk_lease_read": 8.0,  # ... and its lease once per TTL
    "walk_gate_per_claim": 8.0,  # the gate in the tail: each live claim's done marker, failed/ and lease
    "walk_heartbeat": 7.0,  # makedirs (3) + probe + create close replace
    "walk_status_per_running": 8.0,
    "walk_stopped_exit_per_claim": 2.0,  # job_outcome opens the markers of shards not known done
}

PENDING, HELD, DONE = range(3)


@dataclass
class Params:
    workers: int
    shards: int
    latency_s: float = 0.001
    nas_ops_per_s: float = 20_000.0
    shard_secs: float = 60.0  # mean time of one shard on a speed-1 node
    shard_sigma: float = 0.2  # lognormal spread of shard times
    speed_sigma: float = 0.5  # lognormal spread of node speeds (median 1)
    fail_fraction: float = 0.05  # nodes that die once, mid-job
    ttl_s: float = 120.0
    poll_s: float = 2.0
    summary_s: float = 5.0
    start_spread_s: float = 30.0  # workers join uniformly over this window
    claim_ahead: bool = True
    gate: bool = True
    status_threads: int = 8  # status reads its pace and progress records this many at a time
    writer_threads: int = 8  # the writer reads the pace records and heartbeats this many at a time
    keeper_phase: bool = True  # keepers look at random phases (False: all at once, for hand-computed cases)
    tries_per_summary: int = 3  # shards found taken before a worker waits for the next summary (0: no limit)
    writer_dies_at: float | None = None  # the summary writer's node dies at this share of the ideal
    bucket_s: float = 10.0
    seed: int = 0
    ops: dict[str, float] = field(default_factory=lambda: {**OPS, **WALK_OPS})

    @property
    def heartbeat_s(self) -> float:
        return self.ttl_s / 4


@dataclass
class Result:
    params: Params
    makespan_s: float
    ideal_s: float
    bound_s: float  # the fluid bound with the same joins and deaths (Sim.fluid_bound)
    done_shards: int
    claims: int
    lost_races: int
    takeovers: int
    deaths: int
    claim_latency_p50_s: float
    claim_latency_p99_s: float
    claim_ops_mean: float
    total_ops: float
    mean_ops_per_s: float
    peak_ops_per_s: float
    writer_cycle_max_s: float
    summary_age_max_s: float
    status_ops: float
    status_s: float
    status_serial_s: float
    summary_reads_per_s: float
    ops_by_kind: dict[str, float]

    @property
    def ratio(self) -> float:
        """Makespan over the fluid bound: what the protocol, the TTL and shard granularity cost."""
        return self.makespan_s / self.bound_s


class Sim:
    WRITER = -1

    def __init__(self, p: Params):
        self.p, o = p, p.ops
        self.o = o
        rng = self.rng = random.Random(p.seed)
        W, S = p.workers, p.shards
        self.speed = [rng.lognormvariate(0.0, p.speed_sigma) for _ in range(W)]
        self.work = [p.shard_secs * rng.lognormvariate(-(p.shard_sigma**2) / 2, p.shard_sigma) for _ in range(S)]
        self.ideal = sum(self.work) / sum(self.speed)
        n_dying = max(1, round(p.fail_fraction * W)) if p.fail_fraction > 0 and W > 1 else 0
        self.writer_node = 0  # the writer lease's holder: a node that does not die (see the docs)
        dying = rng.sample(range(1, W), min(W - 1, n_dying)) if n_dying else []
        self.death_at = {w: rng.uniform(0.1, 0.9) * self.ideal for w in dying}
        self.secs = [p.shard_secs / s for s in self.speed]  # each node's mean shard time (its pace)
        self.join_at = [rng.uniform(0, p.start_spread_s) for _ in range(W)]
        self.bound = self.fluid_bound()
        # shard state
        self.state = [PENDING] * S
        self.free = list(range(S))  # PENDING shards, in a swap-remove list
        self.free_pos = list(range(S))
        self.claim_log: list[tuple[float, int]] = []  # (claimed at, shard) in time order
        self.last_beat: dict[int, float] = {}  # held shard -> its last heartbeat (of a dead holder)
        self.stale: set[int] = set()  # stale candidates listed in the current summary
        self.n_done = 0
        self.holder: dict[int, int] = {}  # shard -> worker
        # the summary
        self.summary_seq = 0
        self.summary_published_at = 0.0
        # every summary written: (published at, seq, its reads began at, free shards, done, stale candidates)
        self.snaps: list[tuple[float, int, float, int, int, set[int]]] = []
        self.snap_times: list[float] = []
        # each worker process's keeper looks at the summary once per interval, at its own phase
        self.phase = [rng.uniform(0, p.summary_s) if p.keeper_phase else 0.0 for _ in range(W)]
        self.writer_cycle_max = 0.0
        self.writer_dead = False
        self.fallback_claims = 0
        self.n_alive = 0  # worker processes that joined and live (each runs a keeper)
        self.summary_age_max = 0.0
        # workers
        self.alive = [True] * W
        self.joined = [False] * W
        self.running: dict[int, int] = {}  # worker -> shard it runs
        self.pace_sum = 0.0  # sum over running workers of 1 / their shard time (the gate's bound)
        self.ahead: dict[int, int] = {}  # worker -> shard claimed ahead
        self.seen_seq = [-1] * W
        self.known_taken: list[set[int]] = [set() for _ in range(W)]
        self.backoff = [p.poll_s] * W
        self.claim_started = [0.0] * (2 * W)
        self.claim_ops_now = [0.0] * (2 * W)
        self.waiting: dict[int, int] = {}  # worker -> its ended shard, while the helper's claim is in flight
        self.claim_lat: list[float] = []
        self.claim_ops: list[float] = []
        self.claims = self.lost = self.takeovers = 0
        self.makespan = 0.0
        # NAS: processor sharing over active bursts (virtual service clock V)
        self.now = 0.0
        self.V = 0.0
        self.bursts: list[tuple[float, int, int]] = []  # (V at finish, seq, client)
        self.active: dict[int, int] = {}  # client -> seq of its burst
        self.burst_of: dict[int, tuple[float, float, str, tuple]] = {}  # client -> (start, ops, kind, then)
        self.events: list[tuple[float, int, str, int, int]] = []
        self.seq = 0
        self.total_ops = 0.0
        self.ops_by_kind: dict[str, float] = {}
        self.buckets: dict[int, float] = {}
        self.holders = 0  # claims being heartbeated (running or claimed ahead)

    def fluid_bound(self) -> float:
        """The earliest end if the work were a fluid: every node works from when it joins until it
        dies (or the end) at its speed, with no protocol, no TTL and no shard granularity."""
        total = sum(self.work)
        lo, hi = 0.0, 2 * self.ideal + self.p.start_spread_s + 1.0
        while hi - lo > 1e-3 * self.ideal:
            mid = (lo + hi) / 2
            done = sum(
                s * max(0.0, min(mid, self.death_at.get(w, math.inf)) - self.join_at[w])
                for w, s in enumerate(self.speed)
            )
            lo, hi = (mid, hi) if done < total else (lo, mid)
        return hi

    # -- NAS ------------------------------------------------------------------------------------------
    def background(self) -> tuple[float, float]:
        """Open-loop ops/s: (heartbeats of the live claims and the writer's lease, the keepers' looks:
        every worker process reads summary.seq, and the summary when it changed, once per interval)."""
        o, h = self.o, self.p.heartbeat_s
        beats = (self.holders + 1) * (o["heartbeat"] + o["progress_flush"] / 2) / h
        looks = self.n_alive * (o["seq_read"] + o["summary_read"]) / self.p.summary_s
        return beats, looks

    def rate(self) -> float:
        free = max(self.p.nas_ops_per_s - sum(self.background()), 0.05 * self.p.nas_ops_per_s)
        n = len(self.active)
        return min(1.0 / self.p.latency_s, free / n) if n else 1.0 / self.p.latency_s

    def advance(self, t: float) -> None:
        dt = t - self.now
        if dt <= 0:
            return
        if self.active:
            self.V += self.rate() * dt
        beats, looks = self.background()
        self.count(beats * dt, "heartbeat", self.now, t)
        self.count(looks * dt, "keeper", self.now, t)
        self.now = t

    def count(self, ops: float, kind: str, a: float, z: float) -> None:
        self.total_ops += ops
        self.ops_by_kind[kind] = self.ops_by_kind.get(kind, 0.0) + ops
        b = self.p.bucket_s
        if z - a <= 1e-12:
            self.buckets[int(a / b)] = self.buckets.get(int(a / b), 0.0) + ops
            return
        per, t = ops / (z - a), a
        while t < z:
            edge = min(z, (int(t / b) + 1) * b)
            self.buckets[int(t / b)] = self.buckets.get(int(t / b), 0.0) + per * (edge - t)
            t = edge

    def burst(self, client: int, ops: float, kind: str, then: tuple, service: float | None = None) -> None:
        """``client`` issues ``ops`` operations back to back, then goes on with ``then``; ``service``:
        the round trips they take when some are issued in parallel (default: one after another)."""
        self.burst_of[client] = (self.now, ops, kind, then)
        if kind == "claim":
            self.claim_ops_now[client] += ops
        self.seq += 1
        self.active[client] = self.seq
        heapq.heappush(self.bursts, (self.V + max(ops if service is None else service, 1e-9), self.seq, client))

    def at(self, t: float, kind: str, w: int, arg: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, w, arg))

    # -- shard state ----------------------------------------------------------------------------------
    def take_free(self, i: int) -> None:
        k = self.free_pos[i]
        last = self.free[-1]
        self.free[k], self.free_pos[last] = last, k
        self.free.pop()
        self.free_pos[i] = -1

    def put_free(self, i: int) -> None:
        self.free_pos[i] = len(self.free)
        self.free.append(i)

    # -- the summary writer ---------------------------------------------------------------------------
    def writer_cycle(self) -> None:
        o = self.o
        if self.writer_dead:
            return
        live_workers = sum(1 for w in range(self.p.workers) if self.joined[w] and self.alive[w])
        ops = o["writer_lists"] + o["writer_per_worker"] * live_workers + o["writer_per_claim"] * len(self.holder)
        taken_at = self.now
        # what the reads see: taken when they start (a claim made during the cycle shows next time)
        snap = (taken_at, len(self.free), self.n_done, self.stale_now(taken_at))
        # the pace records and heartbeats are read writer_threads at a time; the listings and writes in turn
        reads = ops - o["writer_lists"]
        service = o["writer_lists"] + reads / self.p.writer_threads + o["writer_writes"] + o["writer_fence"]
        self.burst(self.WRITER, ops + o["writer_writes"] + o["writer_fence"], "writer", ("published", snap), service)

    def stale_now(self, t: float) -> set[int]:
        """Dead holders' claims whose heartbeat the writer has seen unchanged for a TTL: it reads
        the token every cycle, so it first saw the last value within a cycle of the last beat."""
        return {i for i, beat in self.last_beat.items() if self.state[i] == HELD and t - beat >= self.p.ttl_s}

    def published(self, snap: tuple) -> None:
        taken_at, free, done, stale = snap
        self.summary_age_max = max(self.summary_age_max, self.now - self.summary_published_at)
        self.writer_cycle_max = max(self.writer_cycle_max, self.now - taken_at)
        self.summary_seq += 1
        self.summary_published_at = self.now
        self.snaps.append((self.now, self.summary_seq, taken_at, free, done, stale))
        self.snap_times.append(self.now)
        nxt = max(self.now, taken_at + self.p.summary_s)
        if self.n_done < self.p.shards:
            self.at(nxt, "writer", self.WRITER)

    # -- a claim (client w: the worker; client W + w: its claim-ahead helper) ------------------------
    def view(self, w: int) -> tuple | None:
        """The summary worker ``w`` has: the last one written before its keeper's latest look."""
        k = bisect.bisect_right(self.snap_times, self.now - self.phase[w]) - 1
        return self.snaps[k] if k >= 0 else None

    def pick(self, w: int, v: tuple) -> int | None:
        """A shard the summary shows free, at random: one still free, one claimed since the summary
        was taken (the worker will find it taken), or a stale candidate."""
        i0 = bisect.bisect_left(self.claim_log, (v[2], -1))
        since = len(self.claim_log) - i0
        known = self.known_taken[w]
        stale = [i for i in v[5] if i not in known and self.state[i] == HELD]
        for _ in range(8):
            n = len(self.free) + since + len(stale)
            if n == 0:
                return None
            r = self.rng.randrange(n)
            if r < len(stale):
                return stale[r]
            r -= len(stale)
            i = self.free[r] if r < len(self.free) else self.claim_log[i0 + r - len(self.free)][1]
            if i not in known:
                return i
        return self.free[self.rng.randrange(len(self.free))] if self.free else None

    def start_claim(self, c: int) -> None:
        w, o = c % self.p.workers, self.o
        self.claim_started[c] = self.now
        self.claim_ops_now[c] = 0.0
        ops = o["seq_read"]  # the summary itself: read by the keeper when it changed (background)
        v = self.view(w)
        if v is None:
            self.burst(c, ops, "claim", ("none",))  # no summary yet: wait for the first one
            return
        if self.seen_seq[w] != v[1]:
            self.seen_seq[w] = v[1]
            self.known_taken[w].clear()
        if self.walking():
            self.walk_claim(c, ops)
            return
        self.try_pick(c, ops)

    def walking(self) -> bool:
        """The summary has not advanced for max(3 intervals, TTL / 2): the workers walk the shards as
        without one (they no longer trust it)."""
        return self.now - self.summary_published_at >= max(3 * self.p.summary_s, self.p.ttl_s / 2)

    def walk_claim(self, c: int, ops: float) -> None:
        w, o = c % self.p.workers, self.o
        if not self.free or not self.gate_allows(w, c >= self.p.workers, walking=True):
            held = len(self.holder)
            due = min(1.0, self.backoff[w] / self.p.ttl_s)
            self.burst(c, ops + held * (o["walk_idle_per_claim"] + due * o["walk_lease_read"]), "claim", ("none",))
            return
        self.fallback_claims += 1
        i = self.free[self.rng.randrange(len(self.free))]
        self.burst(c, ops + o["walk_claim"] - o["pace_write"], "claim", ("publish", i))

    def try_pick(self, c: int, ops: float) -> None:
        if self.walking():
            self.walk_claim(c, ops)
            return
        w, o, ahead = c % self.p.workers, self.o, c >= self.p.workers
        v = self.view(w)
        i = self.pick(w, v) if v is not None and v[3] + len(v[5]) > 0 else None
        if i is None or not self.gate_allows(w, ahead, v=v):
            if ops:
                self.burst(c, ops, "claim", ("none",))
            else:
                self.no_claim(c)
            return
        if i in v[5]:
            ops += o["takeover_probe"]
        self.burst(c, ops + o["claim_probe"] + o["claim_publish"], "claim", ("publish", i))

    def gate_allows(self, w: int, ahead: bool, walking: bool = False, v: tuple | None = None) -> bool:
        """should_claim from the summary's paces: in the tail, decline a shard the other running
        nodes will finish sooner (pending <= what they can do before this node finishes one)."""
        if not self.p.gate:
            return True
        pending = len(self.free) if walking or v is None else v[3] + len(v[5])
        mine = self.secs[w] * (0.8 if ahead else 1.0)  # claimed ahead: the running shard's tail first
        if pending > mine * self.pace_sum:  # more than the others could take even without the floors
            return True
        if walking:  # the walk's gate reads every live claim in the tail
            self.count(self.o["walk_gate_per_claim"] * len(self.holder), "claim", self.now, self.now)
        capacity = 0
        for v in self.running:
            if v != w:
                capacity += max(0, math.floor(mine / self.secs[v] - 0.5))
                if capacity >= pending:
                    return False
        return True

    def publish(self, c: int, i: int) -> None:
        w, o = c % self.p.workers, self.o
        v = self.view(w)
        stale_taken = self.state[i] == HELD and i in self.last_beat and v is not None and i in v[5]
        if self.state[i] == PENDING or stale_taken:
            if stale_taken:
                self.takeovers += 1
                self.last_beat.pop(i)
                self.holder.pop(i)
            else:
                self.take_free(i)
            self.state[i] = HELD
            self.holder[i] = w
            self.holders += 1
            self.claim_log.append((self.now, i))
            self.claims += 1
            extra = o["pace_write"] + (o["takeover_record"] if stale_taken else 0)
            self.burst(c, extra, "claim", ("claimed", i))
            return
        self.lost += 1
        self.known_taken[w].add(i)
        self.count(o["claim_lost"] - o["claim_publish"], "claim", self.now, self.now)
        self.claim_ops_now[c] += o["claim_lost"] - o["claim_publish"]
        if self.p.tries_per_summary and len(self.known_taken[w]) >= self.p.tries_per_summary:
            self.no_claim(c)  # taken ones only: wait for the next summary
            return
        self.try_pick(c, 0)

    def claimed(self, c: int, i: int) -> None:
        w = c % self.p.workers
        self.claim_lat.append(self.now - self.claim_started[c])
        self.claim_ops.append(self.claim_ops_now[c])
        if c == w:
            self.start_run(w, i)
            return
        self.ahead[w] = i  # it runs when the running shard ends
        if self.waiting.pop(w, None) is not None:
            self.finish(w)

    def no_claim(self, c: int) -> None:
        w = c % self.p.workers
        if c != w:  # the helper found nothing: the worker claims again when its shard ends
            if self.waiting.pop(w, None) is not None:
                self.finish(w)
            return
        v = self.view(w)
        if v is not None and v[4] >= self.p.shards:
            self.burst(w, self.o["stopped_exit"], "exit", ("exit",))
            return
        self.at(self.now + self.backoff[w], "poll", w)
        self.backoff[w] = min(self.p.summary_s, self.backoff[w] * 2)

    def start_run(self, w: int, i: int) -> None:
        if w not in self.running:
            self.pace_sum += 1.0 / self.secs[w]
        self.running[w] = i
        self.backoff[w] = self.p.poll_s
        # the first beat (run start's attempt records are in "run", charged when it ends), then the shard
        self.burst(w, self.o["first_beat"], "run", ("running", i, self.work[i] / self.speed[w]))

    def finish(self, w: int) -> None:
        """The shard ended (and the helper's claim, if any, is done): its records, then the next one."""
        # the pace record's "finished" goes out with the next claim's write (or the idle flush)
        self.burst(w, self.o["run"], "run", ("finished", self.running[w]))

    # -- the loop -------------------------------------------------------------------------------------
    def on_burst_done(self, c: int) -> None:
        start, ops, kind, then = self.burst_of.pop(c)
        self.active.pop(c, None)
        self.count(ops, kind, start, self.now)
        if c == self.WRITER:
            self.published(then[1])
            return
        w, mode = c % self.p.workers, then[0]
        if not self.alive[w]:
            return
        if mode == "none":
            self.no_claim(c)
        elif mode == "publish":
            self.publish(c, then[1])
        elif mode == "claimed":
            self.claimed(c, then[1])
        elif mode == "running":
            _, i, dur = then
            if self.p.claim_ahead:
                self.at(self.now + 0.8 * dur, "tail", w, i)
            self.at(self.now + dur, "ended", w, i)
        elif mode == "finished":
            i = then[1]
            self.holders -= 1
            self.state[i] = DONE
            self.holder.pop(i, None)
            self.n_done += 1
            self.makespan = self.now
            del self.running[w]
            self.pace_sum -= 1.0 / self.secs[w]
            nxt = self.ahead.pop(w, None)
            if nxt is not None and self.holder.get(nxt) == w:
                self.start_run(w, nxt)
            else:
                self.start_claim(w)
        elif mode == "exit":
            self.alive[w] = False
            self.n_alive -= 1

    def on_event(self, kind: str, w: int, arg: int) -> None:
        W = self.p.workers
        if kind == "writer":
            self.writer_cycle()
            return
        if kind == "writer_dies":  # its rounds stop
            self.writer_dead = True
            self.active.pop(self.WRITER, None)
            self.burst_of.pop(self.WRITER, None)
            # the keepers look at the writer's lease once the summary is silent for 3 intervals, and take
            # it over when its heartbeat has been unchanged for a TTL on their clock
            silent = 3 * self.p.summary_s + self.rng.uniform(0, self.p.summary_s)
            self.at(self.now + silent + self.p.ttl_s, "writer_new", self.WRITER)
            return
        if kind == "writer_new":
            self.writer_dead = False
            self.writer_cycle()
            return
        if kind == "join":
            self.joined[w] = True
            self.n_alive += 1
            self.start_claim(w)
            return
        if kind == "die":
            self.alive[w] = False
            self.n_alive -= self.joined[w]
            if w in self.running:
                self.pace_sum -= 1.0 / self.secs[w]
            for i in (self.running.pop(w, None), self.ahead.pop(w, None)):
                if i is not None and self.holder.get(i) == w:
                    self.last_beat[i] = self.now - self.rng.uniform(0, self.p.heartbeat_s)
                    self.holders -= 1
            for c in (w, W + w):
                self.active.pop(c, None)
                self.burst_of.pop(c, None)
            return
        if kind == "poll":
            v = self.view(w)
            if (v is not None and self.seen_seq[w] != v[1]) or self.walking():
                self.start_claim(w)
            else:
                self.burst(w, self.o["seq_read"], "idle", ("none",))
        elif kind == "tail":
            if self.running.get(w) == arg and w not in self.ahead and (W + w) not in self.active:
                self.start_claim(W + w)
        elif kind == "ended":
            if self.running.get(w) == arg:
                if (W + w) in self.active:  # the helper's claim in flight: the worker waits for it
                    self.waiting[w] = arg
                else:
                    self.finish(w)

    def run(self) -> Result:
        p = self.p
        for w in range(p.workers):
            self.at(self.join_at[w], "join", w)
        for w, t in self.death_at.items():
            self.at(t, "die", w)
        self.at(0.0, "writer", self.WRITER)
        if p.writer_dies_at is not None:
            self.at(p.writer_dies_at * self.ideal, "writer_dies", self.WRITER)
        horizon = 30 * self.ideal + 10 * p.ttl_s
        while self.n_done < p.shards:
            while self.bursts and self.active.get(self.bursts[0][2]) != self.bursts[0][1]:
                heapq.heappop(self.bursts)  # a dead worker's
            t_ev = self.events[0][0] if self.events else math.inf
            t_b = self.now + (self.bursts[0][0] - self.V) / self.rate() if self.bursts else math.inf
            t = min(t_ev, t_b)
            if t == math.inf or t > horizon:
                break
            self.advance(t)
            if t_b <= t_ev:
                _, _, c = heapq.heappop(self.bursts)
                self.on_burst_done(c)
            else:
                _, _, kind, w, arg = heapq.heappop(self.events)
                if kind == "die" or w == self.WRITER or self.alive[w]:
                    self.on_event(kind, w, arg)
        return self.result()

    def result(self) -> Result:
        p, o = self.p, self.o
        lat = sorted(self.claim_lat) or [0.0]
        mk = max(self.makespan, 1e-9)
        buckets = [v / p.bucket_s for b, v in self.buckets.items() if (b + 1) * p.bucket_s <= mk] or [0.0]
        running = min(p.workers, p.shards)
        st_ops = o["status_base"] + o["status_per_node"] * p.workers + o["status_per_running"] * running
        # status at the busiest moment: its threads share what the NAS has left
        spare = max(p.nas_ops_per_s - max(buckets), 0.05 * p.nas_ops_per_s)
        st_s = st_ops / min(p.status_threads / p.latency_s, spare)
        return Result(
            params=p,
            makespan_s=self.makespan,
            ideal_s=self.ideal,
            bound_s=self.bound,
            done_shards=self.n_done,
            claims=self.claims,
            lost_races=self.lost,
            takeovers=self.takeovers,
            deaths=len(self.death_at),
            claim_latency_p50_s=lat[len(lat) // 2],
            claim_latency_p99_s=lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            claim_ops_mean=sum(self.claim_ops) / max(len(self.claim_ops), 1),
            total_ops=self.total_ops,
            mean_ops_per_s=self.total_ops / mk,
            peak_ops_per_s=max(buckets),
            writer_cycle_max_s=self.writer_cycle_max,
            summary_age_max_s=self.summary_age_max,
            status_ops=st_ops,
            status_s=st_s,
            status_serial_s=st_ops * p.latency_s,
            summary_reads_per_s=self.ops_by_kind.get("keeper", 0.0) / (o["seq_read"] + o["summary_read"]) / mk,
            ops_by_kind=dict(self.ops_by_kind),
        )


def simulate(p: Params) -> Result:
    return Sim(p).run()


# -- the op table vs bench_scale.py's measurements ----------------------------------------------------
def measured_ops(bench: dict) -> dict[str, float]:
    """The op table's entries that ``bench_scale.py`` measured (JSON of either protocol); the
    entries that grow with the live claims are slopes between the first and the last idle run."""
    claims = {c["claim_ahead"]: c for c in bench["claims"]}
    plain = claims.get(False) or next(iter(claims.values()))
    idle = sorted(bench["idle"], key=lambda r: r["held"])
    out = {
        "claim_path": plain["claim_path_ops_per_claim"],
        "claim_path_ahead": (claims.get(True) or plain)["claim_path_ops_per_claim"],
        "run": plain["run_ops_per_shard"],
        "first_beat": plain["heartbeat_ops_per_beat"],  # a claim's first beat: the runs are shorter than H
        # the holders' renewals (with their flushes): the median over the idle runs
        "renewal": statistics.median(r["heartbeat_ops_per_beat"] for r in idle) if idle else None,
    }
    if len(idle) >= 2:
        a, b = idle[0], idle[-1]
        dk = b["held"] - a["held"]
        out["idle_poll_per_claim"] = (b["idle_poll_ops_mean"] - a["idle_poll_ops_mean"]) / dk
        # what a poll costs besides the live claims (the protocol's cost per claim taken off), over the runs:
        # on the summary it is the seq (and the summary when it changed) when the keeper did not just look
        per_claim = expectations(bench.get("protocol", "walk"))["idle_poll_per_claim"]
        out["idle_poll_base"] = statistics.fmean(r["idle_poll_ops_mean"] - per_claim * r["held"] for r in idle)
        out["gate_per_claim"] = (b["gate_ops_median"] - a["gate_ops_median"]) / dk
        out["status_per_running"] = (b["status_ops"] - a["status_ops"]) / dk
        out["stopped_exit_per_claim"] = (b["stopped_exit_ops"] - a["stopped_exit_ops"]) / dk
        if a.get("writer_round_ops") is not None and b.get("writer_round_ops") is not None:
            # each holder is a worker process (one pace record) with one live claim (one heartbeat)
            out["writer_round_per_holder"] = (b["writer_round_ops"] - a["writer_round_ops"]) / dk
            out["keeper_look"] = b["other_round_ops"]
    return out


# Where the code on the summary protocol does not do what the specification says: the check
# reports these as differences; the model charges the specified cost, or with --use-measured
# the measured one (see docs/scale.md).
GAPS: dict[str, str] = {
    "idle_poll_base": "a worker walks until it has seen the summary advance: its first polls read every live claim",
}


def expectations(protocol: str, o: dict[str, float] | None = None) -> dict[str, float]:
    """What the op table says bench_scale.py measures: on the summary protocol the specification
    above, on the walk (the code without a summary, and the fallback) ``WALK_OPS``."""
    o = {**OPS, **WALK_OPS, **(o or {})}
    if protocol == "summary":
        return {
            "claim_path": o["seq_read"] + o["claim_probe"] + o["claim_publish"] + o["pace_write"],
            "run": o["run"],
            "first_beat": o["first_beat"],
            "renewal": o["heartbeat"] + o["progress_flush"] / 2,  # the progress flush every other beat
            "idle_poll_per_claim": 0.0,
            "idle_poll_base": o["seq_read"],
            "gate_per_claim": o["gate"],
            "status_per_running": o["status_per_running"],
            "stopped_exit_per_claim": 0.0,
            "writer_round_per_holder": o["writer_per_worker"] + o["writer_per_claim"],
            "keeper_look": o["seq_read"] + o["summary_read"],
        }
    return {
        "claim_path": o["walk_claim"],
        "run": o["run"],
        "first_beat": o["walk_heartbeat"],
        "renewal": o["walk_heartbeat"] + o["progress_flush"],  # the progress flush every beat
        "idle_poll_per_claim": o["walk_idle_per_claim"],
        "idle_poll_base": 0.0,
        "gate_per_claim": o["walk_gate_per_claim"],
        "status_per_running": o["walk_status_per_running"],
        "stopped_exit_per_claim": o["walk_stopped_exit_per_claim"],
    }


def check_ops(bench: dict, tolerance: float = 0.25) -> list[tuple[str, float, float | None, bool]]:
    """(entry, the model's value, the measured value, agree within ``tolerance`` or 1 op), for the
    protocol the benchmark ran on."""
    measured, want = measured_ops(bench), expectations(bench.get("protocol", "walk"))
    rows = []
    for name, value in want.items():
        got = measured.get(name)
        ok = got is not None and abs(got - value) <= max(1.0, tolerance * abs(value))
        rows.append((name, value, got, ok))
    return rows


def ops_from_bench(bench: dict) -> dict[str, float]:
    """The op table with what bench_scale.py measured put in: the summary protocol's entries from
    a run on the summary (the idle poll keeps its specified cost: a worker's walking polls before
    it trusts the summary are left out, see GAPS), the walk's (the fallback) from a run without it."""
    m, ops = measured_ops(bench), {**OPS, **WALK_OPS}
    ops["run"] = m["run"]
    if bench.get("protocol") == "summary":
        rest = ops["seq_read"] + ops["pace_write"] + ops["claim_publish"]
        ops["claim_probe"] = max(0.0, m["claim_path_ahead"] - rest)
        ops["first_beat"] = m["first_beat"]
        if m.get("renewal") is not None:
            ops["progress_flush"] = max(0.0, 2 * (m["renewal"] - ops["heartbeat"]))
        ops["gate"] = max(0.0, m.get("gate_per_claim", 0.0))
        ops["status_per_running"] = m.get("status_per_running", ops["status_per_running"])
        return ops
    ops["walk_claim"] = m["claim_path_ahead"]
    ops["walk_heartbeat"] = m["first_beat"]
    for key in ("idle_poll_per_claim", "gate_per_claim", "status_per_running", "stopped_exit_per_claim"):
        if key in m:
            ops["walk_" + key.replace("idle_poll", "idle")] = m[key]
    return ops


# -- output -------------------------------------------------------------------------------------------
def summary_read_rates(r: Result) -> tuple[float, float, int, int]:
    """(before, after) MB/s of summary reads at the model's read rate: before, every read was
    summary.json; after, it is the brief (with summary.seq read twice a second by every worker, an
    upper bound), each at the bytes bench_summary_bytes.py measures at this W and S (done set
    scattered at random: the worst case).  Also the two sizes, in bytes."""
    bench = _bench_summary_bytes()
    sizes = bench.measure(r.params.workers, r.params.shards, "random")
    reads = r.summary_reads_per_s
    after = reads * sizes.brief + r.params.workers * bench.SEQ_READS_PER_SEC * sizes.seq
    return reads * sizes.summary / 1e6, after / 1e6, sizes.summary, sizes.brief


def _bench_summary_bytes():
    """benchmarks/bench_summary_bytes.py (it imports the package; the model itself does not)."""
    import importlib.util

    if "bench_summary_bytes" not in sys.modules:
        path = Path(__file__).resolve().parent / "bench_summary_bytes.py"
        spec = importlib.util.spec_from_file_location("bench_summary_bytes", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_summary_bytes"] = module  # before running it: its dataclasses look themselves up
        spec.loader.exec_module(module)
    return sys.modules["bench_summary_bytes"]


def summary_bytes_note(r: Result) -> str:
    before, after, summary, brief = summary_read_rates(r)
    return (
        f"the summary read {r.summary_reads_per_s:.0f} times/s: brief {brief / 1000:.1f} kB, {after:.1f} MB/s "
        f"(summary.json {summary / 1000:.0f} kB, {before:.0f} MB/s before)"
    )


def _fmt_s(x: float) -> str:
    if x < 1:
        return f"{x * 1000:.0f} ms"
    if x < 120:
        return f"{x:.1f} s"
    if x < 7200:
        return f"{x / 60:.1f} min"
    return f"{x / 3600:.1f} h"


def _fmt_n(x: float) -> str:
    for unit, div in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


HEADER = (
    "| W | S | peak ops/s (10 s) / mean | claim p50 / p99 | ops per claim | makespan / ideal (/ no-failure ideal) "
    "| lost races | takeovers | writer cycle max | status: ops, time (one read at a time) |"
)


def row(r: Result) -> str:
    p = r.params
    more = "> " if r.done_shards < p.shards else ""
    return (
        f"| {p.workers} | {_fmt_n(p.shards)} | {_fmt_n(r.peak_ops_per_s)} / {_fmt_n(r.mean_ops_per_s)} "
        f"| {_fmt_s(r.claim_latency_p50_s)} / {_fmt_s(r.claim_latency_p99_s)} | {r.claim_ops_mean:.3g} "
        f"| {more}{_fmt_s(r.makespan_s)} / {_fmt_s(r.bound_s)} = {more}{r.ratio:.3f} "
        f"({more}{r.makespan_s / r.ideal_s:.3f}) "
        f"| {r.lost_races} | {r.takeovers}/{r.deaths} | {_fmt_s(r.writer_cycle_max_s)} "
        f"| {_fmt_n(r.status_ops)}: {_fmt_s(r.status_s)} ({_fmt_s(r.status_serial_s)}) |"
    )


def targets(r: Result) -> str:
    p = r.params
    bound = 1.05 if p.workers <= 1000 else 1.10
    checks = [
        ("peak <= C", r.peak_ops_per_s <= p.nas_ops_per_s),
        ("claim p99 < 2 s", r.claim_latency_p99_s < 2.0),
        (f"makespan <= {bound:.2f}x", r.ratio <= bound and r.done_shards == p.shards),
        ("status < 2 s", r.status_s < 2.0),
    ]
    return ", ".join(f"{name}: {'met' if ok else 'MISSED'}" for name, ok in checks)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[100, 1000, 2000])
    ap.add_argument("--shards", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--nas-ops", type=float, default=20_000.0, help="NAS metadata capacity C, ops/s")
    ap.add_argument("--latency-ms", type=float, default=1.0)
    ap.add_argument("--shard-secs", type=float, default=60.0)
    ap.add_argument("--speed-sigma", type=float, default=0.5)
    ap.add_argument("--fail-fraction", type=float, default=0.05)
    ap.add_argument("--ttl", type=float, default=120.0)
    ap.add_argument("--poll", type=float, default=2.0)
    ap.add_argument("--summary-interval", type=float, default=5.0)
    ap.add_argument("--no-claim-ahead", action="store_true")
    ap.add_argument("--no-gate", action="store_true")
    ap.add_argument("--status-threads", type=int, default=8, help="status's reads at a time")
    ap.add_argument("--writer-threads", type=int, default=8, help="the summary writer's reads at a time")
    ap.add_argument("--tries", type=int, default=3, help="lost claims per summary before waiting (0: no limit)")
    ap.add_argument("--writer-dies-at", type=float, help="the summary writer dies at this share of the ideal")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops-from", type=Path, help="bench_scale.py JSON: check the op table against it")
    ap.add_argument("--use-measured", action="store_true", help="with --ops-from: simulate with the measured ops")
    ap.add_argument("--breakdown", action="store_true", help="ops by kind per case")
    a = ap.parse_args(argv)
    ops = {**OPS, **WALK_OPS}
    if a.ops_from:
        bench = json.loads(a.ops_from.read_text())
        print(f"op table vs {a.ops_from} (protocol {bench.get('protocol', '?')}):")
        for name, want, got, ok in check_ops(bench):
            gap = f" ({GAPS[name]})" if not ok and name in GAPS and bench.get("protocol") == "summary" else ""
            print(f"  {name:24} model {want:8.3g}  measured {got if got is None else round(got, 2)!s:>8}  "
                  f"{'agrees' if ok else 'DIFFERS'}{gap}")  # fmt: skip
        if a.use_measured:
            ops = ops_from_bench(bench)
            print(f"simulating with the measured ops: {ops}")
        print()
    print(
        f"NAS {a.nas_ops:g} ops/s, {a.latency_ms} ms/op; shard {a.shard_secs:g} s at speed 1, speeds "
        f"lognormal(sigma={a.speed_sigma}); {a.fail_fraction:.0%} nodes die; ttl {a.ttl:g} s, poll {a.poll:g} s, "
        f"summary every {a.summary_interval:g} s; claim-ahead {'off' if a.no_claim_ahead else 'on'}, "
        f"gate {'off' if a.no_gate else 'on'}; seed {a.seed}\n"
    )
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    notes = []
    for w in a.workers:
        for s in a.shards:
            p = Params(
                workers=w, shards=s, latency_s=a.latency_ms / 1000, nas_ops_per_s=a.nas_ops, shard_secs=a.shard_secs,
                speed_sigma=a.speed_sigma, fail_fraction=a.fail_fraction, ttl_s=a.ttl, poll_s=a.poll,
                summary_s=a.summary_interval, claim_ahead=not a.no_claim_ahead, gate=not a.no_gate,
                status_threads=a.status_threads, writer_threads=a.writer_threads, writer_dies_at=a.writer_dies_at,
                tries_per_summary=a.tries,
                seed=a.seed, ops=ops,
            )  # fmt: skip
            r = simulate(p)
            print(row(r), flush=True)
            notes.append(f"W={w} S={s}: {targets(r)}; {summary_bytes_note(r)}")
            if a.breakdown:
                parts = ", ".join(f"{k} {v / r.total_ops:.0%}" for k, v in sorted(r.ops_by_kind.items()))
                print(f"  ops by kind: {parts}", file=sys.stderr)
    print()
    print("\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
