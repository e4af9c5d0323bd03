"""Scale model of the job-directory protocol as implemented: W workers, S shards, one NAS.

A deterministic (seeded) discrete-event simulation, standard library only. It does not
run the plugin; it replays what the code does, step by step, with the number of
filesystem operations each step issues (``OPS``, derived from the code and checked
against a traced run in ``tests/benchmarks/test_scale_model.py``), and sends those
operations to a NAS modelled as

* a fixed per-operation latency ``latency_s`` (the round trip of one synchronous
  syscall: workers issue them one after another), and
* a metadata capacity ``nas_ops_per_s`` shared by every client (processor sharing:
  with N clients issuing back to back, each gets ``min(1/latency, C_free/N)``
  operations per second, where ``C_free`` is the capacity left over by the open-loop
  background load: heartbeats and the abort watcher).

Unit: one "metadata op" = one filesystem call the code makes through ``sharedfs/fsio.py``
(open/read of a record, open-probe of a name, listdir, create, fsync, close, link,
replace, unlink, fsync of a directory); ``makedirs(exist_ok=True)`` counts 3 (stat of
the parent, mkdir -> EEXIST, stat). Writes of record bytes are data, not counted. A
real NFS client may turn one call into 1-3 RPCs (LOOKUP/ACCESS/GETATTR) or save one
through its caches; the model counts calls. The shard's own data work (reading the
input, Ray, writing the output) is a delay, not metadata.

What is simulated, per worker (one worker per node, ``slots_per_node = 1``):

claim_next (worker_loop.py:175-224) walks the manifest from shard 0 on every call and
pays per shard it passes: a done shard ``scan_done``, a held shard ``scan_held``; at the
first claimable one ``scan_pending`` (never claimed) or ``scan_held`` (released/stale);
then the straggler gate (stragglers.py:412-437, a full pass over all S shards at most
once per ``poll_interval``), the claim publication, and it may lose the link race to a
worker that reached the same shard first (``claim_lost``), then it goes on scanning.
When nothing is claimable it pays the whole pass and sleeps ``poll_interval``. Running a
shard costs ``run_start`` + the shard's duration + ``run_end``; a heartbeat
(``heartbeat``) every ``ttl/4``. Dying nodes stop mid-shard; their shard becomes
claimable ``ttl`` after its last heartbeat (observers judge staleness on their own
clock; the model assumes some observer saw the last value within ``poll_interval/2``)
and the taker pays ``takeover_failure_record`` on top. When every shard is done each
worker pays the exit passes (``exit_per_shard`` x S: the final claim_next, job_outcome
in run_worker and again in flow.py).

Run ``python benchmarks/scale_model.py`` for the W x S table (``--help`` for knobs).
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

# -- metadata operations per step, from the code (see docs/scale.md for file:line) --------------------
OPS: dict[str, int] = {
    # claim_next, per shard passed on the way to the first claimable one
    "scan_done": 1,  # read_done hit (worker_loop.py:180)
    "scan_pending": 5,  # read_done miss, read failed/, listdir failures/, listdir claims/, probe gen-1
    "scan_held": 9,  # + read claim, release, failure, heartbeat of the latest generation
    # the straggler gate's observe() (stragglers.py:412-437), per shard of the whole manifest
    "gate_done": 2,  # read_done + the winner's attempt.json
    "gate_pending": 4,  # read_done, open failed/, listdir claims/, probe gen-1
    "gate_held": 8,  # read_done, open failed/, read_lease of a claimed shard (6)
    # publication and running
    "claim_publish": 10,  # makedirs(3) create fsync close link fsync_dir unlink + exists(done)
    "claim_lost": 10,  # makedirs(3) create fsync close link->EEXIST, same_bytes opens 2, unlink
    "run_start": 17,  # heartbeat start (7), open_attempt makedirs(3)+atomic_write(5), check + open input
    # fence probe, publish_done (13), close_attempt (6), release (9), final progress write (3)
    "run_end": 32,
    # probe gen+1, makedirs(3), create close replace (durable=False); +3 (progress.json) when progress changed
    "heartbeat": 7,
    "takeover_failure_record": 12,  # record_failure: makedirs(3)+publish(6), listdir+1 read, read failed/
    "abort_watch": 2,  # AbortWatcher every poll: read outcome.json, listdir failed/
    "exit_per_shard": 3,  # final claim_next pass + job_outcome twice (worker_loop.py:122, flow.py:84)
    # the claim cursor (jobdir/claiming.py, protocol "cursor"): per probe of a shard it does not know is done
    "cursor_probe_done": 1,  # read_done hit (then: retired, and a jump)
    "cursor_probe_pending": 5,  # = scan_pending
    "cursor_probe_held": 9,  # = scan_held; then only its done marker is read until it could be stale (a TTL)
    "cursor_probe_watched": 1,  # read_done of a held shard seen before that cannot be stale yet
    "cursor_listing": 1,  # listdir(done/): at start, and after 16 unknown done markers
    # the gate's observe() with listings (stragglers.py): 2 listings + a sample of new done spans + live claims
    "gate_listings": 2,  # listdir claims/ + listdir done/
    "gate_new_span": 2,  # read_done + attempt.json, at most MAX_NEW_SPANS (16) per call
    "gate_claimed": 8,  # tail only: read_done, exists(failed), read_lease (6) per claimed, not done shard
    # `dj-elastic status` (status.py:452-496), per shard
    "status_done": 11,
    "status_held": 13,
    "status_pending": 6,
}

PENDING, HELD, ORPHAN, STALE, DONE = range(5)


@dataclass
class Params:
    workers: int
    shards: int
    latency_s: float = 0.001
    nas_ops_per_s: float = 50_000.0
    shard_secs: float = 60.0  # mean time of one shard on a speed-1 node
    shard_sigma: float = 0.2  # lognormal spread of shard times
    speed_sigma: float = 0.5  # lognormal spread of node speeds (median 1)
    fail_fraction: float = 0.05  # nodes that die once, mid-job
    ttl_s: float = 120.0
    poll_s: float = 2.0
    start_spread_s: float = 30.0  # workers join uniformly over this window (scheduler, Ray start)
    horizon_x: float = 30.0  # stop simulating at this multiple of the ideal makespan
    gate: bool = True  # straggler gate on (the executor's default outside strict mode)
    protocol: str = "cursor"  # "cursor": the claim cursor; "scan": the walk from shard 0 before it
    seed: int = 0

    @property
    def heartbeat_s(self) -> float:
        return self.ttl_s / 4


class Fenwick:
    """Counts over shard indices: add, prefix sums, first index >= pos with a one."""

    def __init__(self, n: int):
        self.n, self.t = n, [0] * (n + 1)
        self.log = 1 << max(0, n.bit_length() - 1) if n else 0

    def add(self, i: int, v: int) -> None:
        i += 1
        while i <= self.n:
            self.t[i] += v
            i += i & -i

    def prefix(self, i: int) -> int:  # sum over [0, i)
        s = 0
        while i > 0:
            s += self.t[i]
            i -= i & -i
        return s

    def range(self, a: int, b: int) -> int:
        return self.prefix(b) - self.prefix(a) if b > a else 0

    def first_at_or_after(self, pos: int) -> int | None:
        k = self.prefix(pos) + 1  # the k-th one (1-based)
        if k > self.prefix(self.n):
            return None
        i, step = 0, self.log
        while step:
            if i + step <= self.n and self.t[i + step] < k:
                i += step
                k -= self.t[i]
            step >>= 1
        return i


@dataclass
class Result:
    params: Params
    makespan_s: float  # when the last shard was done (a lower bound when done_shards < shards)
    done_shards: int
    ideal_s: float
    all_exited_s: float
    claims: int
    claim_latency_mean_s: float
    claim_latency_p99_s: float
    claim_ops_mean: float
    claim_ops_p99: float
    lost_races: int
    takeovers: int
    deaths: int
    total_ops: float
    mean_ops_per_s: float
    peak_ops_per_s: float
    saturated_frac: float
    heartbeat_writes_per_s: float
    heartbeat_ops_per_s: float
    status_ops: int
    ops_by_kind: dict[str, float] = field(default_factory=dict)
    listings: int = 0  # directory listings (done/, claims/) by the claim path and the gate
    listed_entries: int = 0  # names those listings returned (a listing is 1 op, but O(S) names)

    @property
    def status_s(self) -> float:
        return self.status_ops * self.params.latency_s


class Sim:
    def __init__(self, p: Params):
        self.p = p
        rng = random.Random(p.seed)
        self.rng = rng
        W, S = p.workers, p.shards
        self.speed = [rng.lognormvariate(0.0, p.speed_sigma) for _ in range(W)]
        self.work = [p.shard_secs * rng.lognormvariate(-(p.shard_sigma**2) / 2, p.shard_sigma) for _ in range(S)]
        self.ideal = sum(self.work) / sum(self.speed)
        n_dying = max(1, round(p.fail_fraction * W)) if p.fail_fraction > 0 else 0
        dying = rng.sample(range(W), min(W, n_dying))
        self.death_at = {w: rng.uniform(0.1, 0.9) * self.ideal for w in dying}
        self.state = [PENDING] * S
        self.gen = [0] * S
        self.done_t, self.held_t, self.claimable_t, self.stale_t = Fenwick(S), Fenwick(S), Fenwick(S), Fenwick(S)
        for i in range(S):
            self.claimable_t.add(i, 1)
        self.n_done = 0
        self.n_pending = S  # PENDING shards (gen 0 or released): what the gate counts as pending
        self.claimant: dict[int, int] = {}
        self.holding: dict[int, int] = {}  # worker -> shard
        self.running_secs: dict[int, float] = {}  # worker -> its mean shard secs, while holding (gate input)
        self.has_done = [False] * W
        self.alive = [True] * W
        self.n_alive = W
        self.min_secs = p.shard_secs / max(self.speed)
        starts = [rng.uniform(0, p.start_spread_s) for _ in range(W)]
        self.start_at = starts
        self.gate_cache: list[tuple[float, bool] | None] = [None] * W
        # NAS: processor sharing over active bursts, virtual service clock V
        self.now = 0.0
        self.V = 0.0
        self.bursts: list[tuple[float, int, int, int]] = []  # (V_finish, seq, worker, token)
        self.active: dict[int, int] = {}  # worker -> token of its active burst
        self.burst_info: dict[int, tuple[float, float, str]] = {}  # worker -> (start, ops, kind)
        self.events: list[tuple[float, int, str, int, int]] = []  # (t, seq, kind, worker, arg)
        self.seq = 0
        self.total_ops = 0.0
        self.ops_by_kind: dict[str, float] = {}
        self.saturated_time = 0.0
        self.bucket_s = 10.0
        self.buckets: dict[int, float] = {}  # ops landing in bucket b
        self.rate_diff: dict[int, float] = {}  # + ops/s over whole buckets from b on (difference array)
        # per worker claim bookkeeping
        self.mode: list[tuple] = [()] * W
        self.call_start = [0.0] * W
        self.call_ops = [0.0] * W
        self.lat: list[float] = []
        self.claim_ops: list[float] = []
        self.lost = self.takeovers = 0
        self.makespan = 0.0
        self.exited = 0
        self.last_exit = 0.0

    # -- NAS ------------------------------------------------------------------------------------------
    def background(self) -> float:
        live = self.n_alive
        return len(self.holding) * OPS["heartbeat"] / self.p.heartbeat_s + live * OPS["abort_watch"] / self.p.poll_s

    def rate(self) -> tuple[float, float]:
        """(per-burst service rate, free capacity)."""
        free = max(self.p.nas_ops_per_s - self.background(), 0.05 * self.p.nas_ops_per_s)
        n = len(self.active)
        return (min(1.0 / self.p.latency_s, free / n) if n else 1.0 / self.p.latency_s), free

    def advance(self, t: float) -> None:
        dt = t - self.now
        if dt <= 0:
            return
        r, free = self.rate()
        n = len(self.active)
        if n:
            self.V += r * dt
            if n / self.p.latency_s > free:
                self.saturated_time += dt
        self.count(self.background() * dt, "background", spread=(self.now, t))
        self.now = t

    def count(self, ops: float, kind: str, spread: tuple[float, float] | None = None) -> None:
        self.total_ops += ops
        self.ops_by_kind[kind] = self.ops_by_kind.get(kind, 0.0) + ops
        a, z = spread if spread is not None else (self.now, self.now)
        ba, bz = int(a / self.bucket_s), int(z / self.bucket_s)
        if ba == bz:
            self.buckets[ba] = self.buckets.get(ba, 0.0) + ops
            return
        per = ops / (z - a)
        self.buckets[ba] = self.buckets.get(ba, 0.0) + per * ((ba + 1) * self.bucket_s - a)
        self.buckets[bz] = self.buckets.get(bz, 0.0) + per * (z - bz * self.bucket_s)
        if bz > ba + 1:
            self.rate_diff[ba + 1] = self.rate_diff.get(ba + 1, 0.0) + per
            self.rate_diff[bz] = self.rate_diff.get(bz, 0.0) - per

    def burst(self, w: int, ops: float, kind: str, mode: tuple) -> None:
        """Worker w issues ``ops`` operations back to back, then continues in ``mode``."""
        self.burst_info[w] = (self.now, ops, kind)
        if kind.startswith("claim"):
            self.call_ops[w] += ops
        self.mode[w] = mode
        self.seq += 1
        self.active[w] = self.seq
        heapq.heappush(self.bursts, (self.V + max(ops, 1e-9), self.seq, w, self.seq))

    def at(self, t: float, kind: str, w: int, arg: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, w, arg))

    # -- shard state ----------------------------------------------------------------------------------
    def set_state(self, i: int, new: int) -> None:
        old = self.state[i]
        if old == new:
            return
        held = (HELD, ORPHAN, STALE)
        if old == DONE:
            self.done_t.add(i, -1)
        if new == DONE:
            self.done_t.add(i, 1)
            self.n_done += 1
        if old in held and new not in held:
            self.held_t.add(i, -1)
        if new in held and old not in held:
            self.held_t.add(i, 1)
        if old in (PENDING, STALE):
            self.claimable_t.add(i, -1)
        if new in (PENDING, STALE):
            self.claimable_t.add(i, 1)
        if old == STALE:
            self.stale_t.add(i, -1)
        if new == STALE:
            self.stale_t.add(i, 1)
        if old == PENDING:
            self.n_pending -= 1
        if new == PENDING:
            self.n_pending += 1
        self.state[i] = new

    def pass_cost(self, a: int, b: int) -> int:
        """claim_next's cost of walking past shards [a, b) (none of them claimable)."""
        d = self.done_t.range(a, b)
        h = self.held_t.range(a, b)
        return d * OPS["scan_done"] + h * OPS["scan_held"] + (b - a - d - h) * OPS["scan_pending"]

    def target_cost(self, i: int) -> int:
        return OPS["scan_pending"] if self.gen[i] == 0 else OPS["scan_held"]

    def gate_cost(self) -> int:
        d, h = self.n_done, self.held_t.prefix(self.p.shards)
        return d * OPS["gate_done"] + h * OPS["gate_held"] + (self.p.shards - d - h) * OPS["gate_pending"]

    # -- worker steps -----------------------------------------------------------------------------------
    def start_call(self, w: int) -> None:
        self.call_start[w] = self.now
        self.call_ops[w] = 0.0
        self.scan_from(w, 0)

    def scan_from(self, w: int, pos: int, gated_out: bool = False) -> None:
        tree = self.stale_t if gated_out else self.claimable_t
        t = tree.first_at_or_after(pos) if pos < self.p.shards else None
        if t is None:
            self.burst(w, self.pass_cost(pos, self.p.shards), "claim scan", ("nowork",))
        else:
            self.burst(w, self.pass_cost(pos, t) + self.target_cost(t), "claim scan", ("target", t, gated_out))

    def on_burst_done(self, w: int) -> None:
        mode = self.mode[w]
        kind = mode[0]
        if kind == "nowork":
            if self.n_done == self.p.shards:
                rest = (OPS["exit_per_shard"] - OPS["scan_done"]) * self.p.shards  # this pass was the first
                self.burst(w, rest, "exit", ("exit",))
            else:
                self.at(self.now + self.p.poll_s, "poll", w)
        elif kind == "exit":
            self.exited += 1
            self.alive[w] = False
            self.n_alive -= 1
            self.last_exit = self.now
        elif kind == "target":
            _, t, gated_out = mode
            st = self.state[t]
            if st not in (PENDING, STALE) or (gated_out and st != STALE):
                self.scan_from(w, t + 1, gated_out)
            elif st == STALE:
                self.claimant.setdefault(t, w)
                self.burst(w, OPS["takeover_failure_record"] + OPS["claim_publish"], "claim takeover", ("publish", t))
            elif self.p.gate:  # observe() runs even before this node has a result (then it always allows)
                cached = self.gate_cache[w]
                if cached is not None and self.now - cached[0] < self.p.poll_s:
                    self.gate_decide(w, t, cached[1])
                else:
                    self.burst(w, self.gate_cost(), "claim gate", ("gate", t, self.now))
            else:
                self.publish(w, t)
        elif kind == "gate":
            _, t, started = mode
            allowed = self.gate_allows(w)
            self.gate_cache[w] = (started, allowed)  # ClaimGate stamps its cache before observe() runs
            self.gate_decide(w, t, allowed)
        elif kind == "publish":
            t = mode[1]
            if self.claimant.get(t) == w and self.state[t] in (PENDING, STALE):
                del self.claimant[t]
                if self.state[t] == STALE:
                    self.takeovers += 1
                self.gen[t] += 1
                self.set_state(t, HELD)
                self.holding[w] = t
                self.running_secs[w] = self.p.shard_secs / self.speed[w]
                self.lat.append(self.now - self.call_start[w])
                self.claim_ops.append(self.call_ops[w])
                self.burst(w, OPS["run_start"], "run", ("running", t))
            else:
                self.lost += 1
                self.count(OPS["claim_lost"] - OPS["claim_publish"], "claim scan")
                self.call_ops[w] += OPS["claim_lost"] - OPS["claim_publish"]
                self.after_lost(w, t)
        elif kind == "running":
            t = mode[1]
            self.active.pop(w, None)
            self.at(self.now + self.work[t] / self.speed[w], "run_end", w, t)
        elif kind == "ending":
            t = mode[1]
            self.set_state(t, DONE)
            self.makespan = self.now
            del self.holding[w]
            self.running_secs.pop(w, None)
            self.has_done[w] = True
            self.start_call(w)

    def after_lost(self, w: int, t: int) -> None:
        self.scan_from(w, t + 1)

    def gate_decide(self, w: int, t: int, allowed: bool) -> None:
        if allowed:
            self.publish(w, t)
        else:
            self.scan_from(w, t + 1, gated_out=True)

    def publish(self, w: int, t: int) -> None:
        if self.state[t] in (PENDING, STALE):  # else our link will fail: someone won while we looked
            self.claimant.setdefault(t, w)
        self.burst(w, OPS["claim_publish"], "claim publish", ("publish", t))

    def gate_allows(self, w: int) -> bool:
        """stragglers.should_claim with true mean speeds (observe() measures them)."""
        mine = self.p.shard_secs / self.speed[w]
        pending = self.n_pending
        if pending <= 0 or not self.has_done[w]:
            return True
        if pending > len(self.running_secs) * (mine / self.min_secs):
            return True  # cannot decline: even the fastest possible workers could not take them all
        others = [s for v, s in self.running_secs.items() if v != w and self.has_done[v]]
        if not others:
            return True
        capacity = sum(math.floor(mine / d - 0.5) for d in others)
        return pending > capacity

    def die(self, w: int) -> None:
        if not self.alive[w]:
            return
        self.alive[w] = False
        self.n_alive -= 1
        self.active.pop(w, None)  # its burst, if any, is dropped (lazily skipped in the heap)
        self.running_secs.pop(w, None)
        t = self.holding.pop(w, None)
        if t is not None:
            self.set_state(t, ORPHAN)
            last_beat = self.now - self.rng.uniform(0, self.p.heartbeat_s)
            self.schedule_stale(t, last_beat)
        for i, c in list(self.claimant.items()):
            if c == w:
                del self.claimant[i]
        self.exited += 1  # never exits by itself; counted so that the run can end

    def schedule_stale(self, t: int, last_beat: float) -> None:
        self.at(max(self.now, last_beat + self.p.ttl_s + self.p.poll_s / 2), "stale", -1, t)

    # -- main loop --------------------------------------------------------------------------------------
    def run(self, max_events: int = 50_000_000) -> Result:
        for w in range(self.p.workers):
            self.at(self.start_at[w], "poll", w)
        for w, t in self.death_at.items():
            self.at(t, "die", w)
        n = 0
        horizon = self.p.horizon_x * self.ideal
        while self.exited < self.p.workers and n < max_events and (self.now < horizon or self.n_done == self.p.shards):
            n += 1
            while self.bursts and self.active.get(self.bursts[0][2]) != self.bursts[0][3]:
                heapq.heappop(self.bursts)  # superseded or dropped
            t_burst = math.inf
            if self.bursts:
                r, _ = self.rate()
                t_burst = self.now + max(self.bursts[0][0] - self.V, 0.0) / r
            t_event = self.events[0][0] if self.events else math.inf
            if t_burst == math.inf and t_event == math.inf:
                break
            if t_burst <= t_event:
                self.advance(t_burst)
                _, _, w, _ = heapq.heappop(self.bursts)
                del self.active[w]
                start, ops, kind = self.burst_info.pop(w)
                self.count(ops, kind, spread=(start, self.now))
                self.on_burst_done(w)
            else:
                t, _, kind, w, arg = heapq.heappop(self.events)
                self.advance(t)
                if kind == "stale":
                    if self.state[arg] == ORPHAN:
                        self.set_state(arg, STALE)
                elif not self.alive[w]:
                    continue
                elif kind == "poll":
                    self.start_call(w)
                elif kind == "run_end":
                    self.burst(w, OPS["run_end"], "run", ("ending", arg))
                elif kind == "die":
                    self.die(w)
        return self.result()

    def result(self) -> Result:
        p = self.p
        lat = sorted(self.lat) or [0.0]
        ops = sorted(self.claim_ops) or [0.0]
        end = max(self.now, 1e-9)
        peak, rate = 0.0, 0.0
        for b in range(int(end / self.bucket_s)):  # whole buckets only
            rate += self.rate_diff.get(b, 0.0)
            peak = max(peak, rate + self.buckets.get(b, 0.0) / self.bucket_s)
        return Result(
            params=p,
            makespan_s=self.makespan if self.n_done == p.shards else self.now,
            done_shards=self.n_done,
            ideal_s=self.ideal,
            all_exited_s=self.last_exit,
            claims=len(self.lat),
            claim_latency_mean_s=statistics.fmean(lat),
            claim_latency_p99_s=_pct(lat, 0.99),
            claim_ops_mean=statistics.fmean(ops),
            claim_ops_p99=_pct(ops, 0.99),
            lost_races=self.lost,
            takeovers=self.takeovers,
            deaths=len(self.death_at),
            total_ops=self.total_ops,
            mean_ops_per_s=self.total_ops / end,
            peak_ops_per_s=peak,
            saturated_frac=self.saturated_time / end,
            heartbeat_writes_per_s=p.workers / p.heartbeat_s,
            heartbeat_ops_per_s=p.workers * OPS["heartbeat"] / p.heartbeat_s,
            status_ops=status_ops(p.shards, done=p.shards),
            ops_by_kind=dict(self.ops_by_kind),
            listings=getattr(self, "listings", 0),
            listed_entries=getattr(self, "listed_entries", 0),
        )


class MaxTree:
    """Max over shard indices of their done time (inf while not done): the first index >= p
    that a worker whose last done/ listing was at time L does not know to be done."""

    def __init__(self, n: int):
        self.size = 1 << max(1, (n - 1).bit_length())
        self.t = [math.inf] * (2 * self.size)
        for i in range(n, self.size):
            self.t[self.size + i] = -math.inf  # padding: never a candidate

    def set(self, i: int, v: float) -> None:
        i += self.size
        self.t[i] = v
        i //= 2
        while i:
            self.t[i] = max(self.t[2 * i], self.t[2 * i + 1])
            i //= 2

    def first_above(self, p: int, limit: float) -> int | None:
        """Smallest index >= p whose value is > limit."""
        return self._descend(1, 0, self.size, p, limit)

    def _descend(self, node: int, lo: int, hi: int, p: int, limit: float) -> int | None:
        if hi <= p or self.t[node] <= limit:
            return None
        if hi - lo == 1:
            return lo
        mid = (lo + hi) // 2
        left = self._descend(2 * node, lo, mid, p, limit)
        return left if left is not None else self._descend(2 * node + 1, mid, hi, p, limit)


class CursorSim(Sim):
    """The claim path of jobdir/claiming.py, op for op, over the same NAS and job.

    Each worker keeps its own cursor: the time of its last done/ listing (it knows every
    shard done before it), the done markers it read since, and the held shards it saw
    with the time they could first be stale for it.  A claim walks forward from after the
    worker's last claim, skipping known-done shards for free; a probe of someone else's
    shard (held, or done unknown) makes it jump to a random place, at most MAX_JUMPS times.
    Two simplifications keep the simulation fast, both documented in docs/scale.md: a walk
    that probes more than ``STEP_CAP`` shards, and every walk while no shard is claimable
    (the tail), is charged by formula (``idle_ops``); and a dead holder's shard becomes
    claimable to everyone a TTL after the first worker read its frozen heartbeat.
    """

    MAX_JUMPS = 4
    LIST_AFTER = 16
    MAX_NEW_SPANS = 16
    STEP_CAP = 256

    def __init__(self, p: Params):
        super().__init__(p)
        W, S = p.workers, p.shards
        self.tree = MaxTree(S)
        self.done_times: list[float] = []
        self.pos = [0] * W
        self.listed_at = [-math.inf] * W  # knows every shard done at or before this time
        self.listed = [False] * W
        self.learned: list[set[int]] = [set() for _ in range(W)]  # done markers read since the listing
        self.surprises = [0] * W
        self.watch: list[dict[int, float]] = [{} for _ in range(W)]  # held shard -> when it could be stale
        self.last_sweep = [-math.inf] * W
        self.spans_known = [0] * W  # the gate's cached done spans
        self.gate_until = [-math.inf] * W
        self.gate_answer = [True] * W
        self.first_probe: dict[int, float] = {}
        self.orphan_set: set[int] = set()
        self.own = [0] * W
        self.n_never = S  # shards never claimed (not in claims/)
        self.listings = 0
        self.listed_entries = 0
        self.walk_rng = random.Random(p.seed + 1)

    # -- knowledge ------------------------------------------------------------------------------------
    def set_state(self, i: int, new: int) -> None:
        if new == DONE and self.state[i] != DONE:
            self.tree.set(i, self.now)
            self.done_times.append(self.now)
        if new == ORPHAN:
            self.orphan_set.add(i)
        else:
            self.orphan_set.discard(i)
        super().set_state(i, new)

    def known_done(self, w: int) -> int:
        import bisect

        return bisect.bisect_right(self.done_times, self.listed_at[w]) + len(self.learned[w])

    def take_listing(self, w: int, charged: bool = True) -> int:
        if charged:
            self.listings += 1
            self.listed_entries += self.n_done  # a listing returns every done marker: O(S) names, 1 call
        self.listed_at[w], self.listed[w] = self.now, True
        self.learned[w].clear()
        self.surprises[w] = 0
        return OPS["cursor_listing"]

    def schedule_stale(self, t: int, last_beat: float) -> None:
        pass  # stale for an observer a TTL after it first read the frozen heartbeat (see probe_held)

    def probe_held(self, w: int, i: int) -> None:
        self.watch[w][i] = self.now + self.p.ttl_s
        if self.state[i] == ORPHAN and i not in self.first_probe:
            self.first_probe[i] = self.now
            self.at(self.now + self.p.ttl_s, "stale", -1, i)

    # -- one claim call --------------------------------------------------------------------------------
    def start_call(self, w: int) -> None:
        self.call_start[w] = self.now
        self.call_ops[w] = 0.0
        self.walk(w, self.pos[w], may_list=True)

    def walk(self, w: int, pos: int, may_list: bool) -> None:
        S = self.p.shards
        ops = self.take_listing(w) if may_list and (not self.listed[w] or self.surprises[w] >= self.LIST_AFTER) else 0
        listed_now = ops > 0
        if self.n_pending == 0 and self.stale_t.prefix(S) == 0:
            self.idle(w, ops)  # nothing claimable anywhere: the walk sweeps everything it does not know
            return
        visited: set[int] = set()
        jumps = steps = 0
        i = pos
        while True:
            i = self.next_candidate(w, i, visited)
            if i is None or steps >= self.STEP_CAP:
                self.idle(w, ops)
                return
            visited.add(i)
            steps += 1
            st, jump = self.state[i], False
            if st == DONE:
                ops += OPS["cursor_probe_done"]
                self.learned[w].add(i)
                self.surprises[w] += 1
                jump = True
                if not listed_now and self.surprises[w] >= self.LIST_AFTER:
                    ops += self.take_listing(w)
                    listed_now = True
            elif st in (HELD, ORPHAN):
                if self.watch[w].get(i, -math.inf) > self.now:
                    ops += OPS["cursor_probe_watched"]  # seen held, cannot be stale yet: done marker only
                    jump = True
                else:
                    ops += OPS["cursor_probe_held"]
                    self.probe_held(w, i)
                    jump = True
            elif st == STALE:
                ops += OPS["cursor_probe_held"]
                self.burst(w, ops, "claim scan", ("ctarget", i))
                return
            else:  # PENDING (never claimed, or released)
                ops += OPS["cursor_probe_pending"] if self.gen[i] == 0 else OPS["cursor_probe_held"]
                self.burst(w, ops, "claim scan", ("ctarget", i))
                return
            if jump and jumps < self.MAX_JUMPS:
                jumps += 1
                i = self.walk_rng.randrange(S)
            else:
                i = (i + 1) % S

    def next_candidate(self, w: int, i: int, visited: set[int]) -> int | None:
        S, limit, learned = self.p.shards, self.listed_at[w], self.learned[w]
        if len(visited) >= S - self.known_done(w):
            return None
        wrapped = False
        while True:
            j = self.tree.first_above(i, limit) if i < S else None
            if j is None:
                if wrapped:
                    return None
                wrapped, i = True, 0
                continue
            if j not in learned and j not in visited:
                return j
            i = j + 1

    def idle(self, w: int, ops: float) -> None:
        """A walk that finds nothing to claim: it reads the done markers it did not know
        (a listing after 16), each held shard once per TTL, and every pending one (declined)."""
        unknown = self.n_done - self.known_done(w)
        listing = self.LIST_AFTER + OPS["cursor_listing"]
        ops += unknown * OPS["cursor_probe_done"] if unknown < self.LIST_AFTER else listing
        self.take_listing(w, charged=unknown >= self.LIST_AFTER)
        held = self.held_t.prefix(self.p.shards)
        due = min(1.0, (self.now - self.last_sweep[w]) / self.p.ttl_s)  # share of held shards due again
        ops += held * (OPS["cursor_probe_watched"] + (OPS["cursor_probe_held"] - OPS["cursor_probe_watched"]) * due)
        ops += OPS["cursor_probe_pending"] * self.n_pending
        self.last_sweep[w] = self.now
        for i in list(self.orphan_set):
            self.probe_held(w, i)
        self.burst(w, ops, "claim scan", ("nowork",))

    # -- the rest of a claim ---------------------------------------------------------------------------
    def on_burst_done(self, w: int) -> None:
        mode = self.mode[w]
        kind = mode[0]
        if kind == "nowork" and self.n_done == self.p.shards:
            # run_worker's job_outcome skips every shard the cursor knows is done: all of them by now
            self.burst(w, 0, "exit", ("exit",))
        elif kind == "ctarget":
            t = mode[1]
            st = self.state[t]
            if st == STALE:
                self.claimant.setdefault(t, w)
                self.burst(w, OPS["takeover_failure_record"] + OPS["claim_publish"], "claim takeover", ("publish", t))
            elif st != PENDING:
                self.walk(w, self.walk_rng.randrange(self.p.shards), may_list=False)  # taken meanwhile: jump
            elif not self.p.gate:
                self.publish(w, t)
            elif self.now < self.gate_until[w]:
                self.gate_decide(w, t, self.gate_answer[w])
            else:
                new = min(self.n_done - self.spans_known[w], self.MAX_NEW_SPANS)
                self.spans_known[w] += new
                claimed_open = self.held_t.prefix(self.p.shards)  # released ones awaiting a retry are ignored
                cost = OPS["gate_listings"] + new * OPS["gate_new_span"]
                self.listings += 2
                self.listed_entries += self.n_done + (self.p.shards - self.n_never)  # done/ and claims/
                mine = self.p.shard_secs / self.speed[w]
                per_worker = max(0, math.floor(mine / self.min_secs - 0.5))
                margin = self.n_never - claimed_open * per_worker
                valid_for = 0.0
                if self.has_done[w] and margin <= 0:
                    cost += claimed_open * OPS["gate_claimed"]  # the tail: ClaimGate reads the live claims
                elif self.has_done[w]:  # ClaimGate._cannot_decline_for: the margin lasts that long
                    valid_for = 0.5 * (margin - 1) / (claimed_open + 1) * self.min_secs
                self.burst(w, cost, "claim gate", ("cgate", t, self.now, valid_for))
        elif kind == "cgate":
            _, t, started, valid_for = mode
            allowed = self.gate_allows(w)
            # ClaimGate stamps its answer when the read ends and keeps it >= 10x the read's duration
            self.gate_until[w] = self.now + max(self.p.poll_s, 10 * (self.now - started), valid_for)
            self.gate_answer[w] = allowed
            self.gate_decide(w, t, allowed)
        elif kind == "ending":
            t = mode[1]
            self.own[w] += 1
            self.learned[w].add(t)
            self.pos[w] = (t + 1) % self.p.shards
            super().on_burst_done(w)
        elif kind == "publish" and self.claimant.get(mode[1]) == w and self.state[mode[1]] in (PENDING, STALE):
            self.pos[w] = (mode[1] + 1) % self.p.shards
            self.n_never -= self.gen[mode[1]] == 0
            super().on_burst_done(w)
        else:
            super().on_burst_done(w)

    def gate_decide(self, w: int, t: int, allowed: bool) -> None:
        if allowed:
            self.publish(w, t)
        else:
            self.idle(w, 0)  # declined: the rest of the walk finds nothing it may claim

    def after_lost(self, w: int, t: int) -> None:
        self.walk(w, self.walk_rng.randrange(self.p.shards), may_list=False)  # someone else's: jump


def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def status_ops(shards: int, *, done: int = 0, held: int = 0) -> int:
    """Metadata ops of one ``snapshot`` (status.py:434-496) with that many done/held shards (+ manifest)."""
    pending = shards - done - held
    return 1 + done * OPS["status_done"] + held * OPS["status_held"] + pending * OPS["status_pending"]


def simulate(p: Params) -> Result:
    return (CursorSim(p) if p.protocol == "cursor" else Sim(p)).run()


def _fmt_s(x: float) -> str:
    if x < 1:
        return f"{x * 1000:.0f} ms"
    if x < 120:
        return f"{x:.1f} s"
    if x < 7200:
        return f"{x / 60:.1f} min"
    if x < 172800:
        return f"{x / 3600:.1f} h"
    return f"{x / 86400:.1f} d"


def _fmt_n(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


HEADER = (
    "| W | S | claim latency mean / p99 | ops per claim mean / p99 | NAS ops/s mean / peak (saturated) "
    "| heartbeat writes/s (ops/s) | makespan / ideal | all exited | lost races | takeovers "
    "| listings per claim (names listed per claim) | status 1 client |"
)


def row(r: Result) -> str:
    p = r.params
    more = "> " if r.done_shards < p.shards else ""
    unfinished = f" ({r.done_shards / p.shards:.0%} done at the horizon)" if more else ""
    return (
        f"| {p.workers} | {_fmt_n(p.shards)} "
        f"| {_fmt_s(r.claim_latency_mean_s)} / {_fmt_s(r.claim_latency_p99_s)} "
        f"| {_fmt_n(r.claim_ops_mean)} / {_fmt_n(r.claim_ops_p99)} "
        f"| {_fmt_n(r.mean_ops_per_s)} / {_fmt_n(r.peak_ops_per_s)} ({r.saturated_frac:.0%}) "
        f"| {r.heartbeat_writes_per_s:.3g} ({r.heartbeat_ops_per_s:.3g}) "
        f"| {more}{_fmt_s(r.makespan_s)} / {_fmt_s(r.ideal_s)} = {more}{r.makespan_s / r.ideal_s:.3g}{unfinished} "
        f"| {more}{_fmt_s(r.all_exited_s if not more else r.makespan_s)} | {r.lost_races} | {r.takeovers}/{r.deaths} "
        f"| {r.listings / max(r.claims, 1):.2g} ({_fmt_n(r.listed_entries / max(r.claims, 1))}) "
        f"| {_fmt_n(r.status_ops)} ops, {_fmt_s(r.status_s)} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--shards", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--latency-ms", type=float, default=1.0)
    ap.add_argument("--nas-ops", type=float, default=50_000.0, help="NAS metadata capacity, ops/s")
    ap.add_argument("--shard-secs", type=float, default=60.0)
    ap.add_argument("--speed-sigma", type=float, default=0.5)
    ap.add_argument("--fail-fraction", type=float, default=0.05)
    ap.add_argument("--ttl", type=float, default=120.0)
    ap.add_argument("--poll", type=float, default=2.0)
    ap.add_argument("--no-gate", action="store_true", help="straggler gate off (strict mode)")
    ap.add_argument(
        "--protocol",
        choices=("cursor", "scan"),
        default="cursor",
        help="cursor: the claim cursor; scan: the walk from shard 0 before it",
    )
    ap.add_argument("--start-spread", type=float, default=30.0, help="workers join uniformly over this many s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--breakdown", action="store_true", help="also print ops by kind per case")
    a = ap.parse_args(argv)
    print(
        f"latency {a.latency_ms} ms/op, NAS {a.nas_ops:g} ops/s, shard {a.shard_secs:g} s at speed 1, "
        f"speeds lognormal(sigma={a.speed_sigma}), {a.fail_fraction:.0%} nodes die, ttl {a.ttl:g} s, "
        f"poll {a.poll:g} s, gate {'off' if a.no_gate else 'on'}, protocol {a.protocol}, seed {a.seed}\n"
    )
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    for w in a.workers:
        for s in a.shards:
            p = Params(
                workers=w,
                shards=s,
                latency_s=a.latency_ms / 1000,
                nas_ops_per_s=a.nas_ops,
                shard_secs=a.shard_secs,
                speed_sigma=a.speed_sigma,
                fail_fraction=a.fail_fraction,
                ttl_s=a.ttl,
                poll_s=a.poll,
                gate=not a.no_gate,
                protocol=a.protocol,
                start_spread_s=a.start_spread,
                seed=a.seed,
            )
            t0 = time.perf_counter()
            r = simulate(p)
            print(row(r), flush=True)
            if a.breakdown:
                parts = ", ".join(f"{k} {v / r.total_ops:.0%}" for k, v in sorted(r.ops_by_kind.items()))
                print(f"  ops by kind: {parts}; simulated in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
