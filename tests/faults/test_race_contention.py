"""Fault matrix row 7: exactly-once under contention.

Many real worker processes run the real worker loop on one job with a trivial shard
processor (no Ray) while a chaos controller SIGKILLs holders (and starts replacements)
and SIGSTOPs them for 0.3-2.5 TTL before SIGCONT (zombies).  Half of the workers pretend
to be on other nodes (a boot id of their own), so their deaths are only noticed by the
TTL rule; the others die "on this host" and are taken over as soon as their pid is gone.
Exactly-once is then checked from every worker's history and from the job directory
(``race_harness.check_exactly_once``).

CI runs 8 processes x 60 shards; ``DJ_ELASTIC_FULL_MATRIX=1`` runs the full
24 processes x 400 shards.  The numbers seen are printed (``pytest -s``).
"""

from __future__ import annotations

import os

import pytest

from .race_harness import Chaos, Lease, check_exactly_once, prepare

FULL = os.environ.get("DJ_ELASTIC_FULL_MATRIX") == "1"
PROCESSES, SHARDS = (24, 400) if FULL else (8, 60)
KILLS, STOPS = (60, 40) if FULL else (10, 6)


@pytest.mark.slow
def test_exactly_once_under_sigkill_and_sigstop(tmp_path):
    job = tmp_path / "job"
    rows = prepare(tmp_path, job, SHARDS)
    chaos = Chaos(tmp_path, [job], Lease(ttl=3.0, heartbeat=0.5), seed=7)
    elapsed = chaos.run(PROCESSES, KILLS, STOPS, chaos_until=0.85)
    stats = check_exactly_once(job, chaos.histories, rows, tmp_path / "merged.jsonl")
    print(
        f"\nrace: {PROCESSES} processes, {SHARDS} shards, {elapsed:.1f}s (load {os.getloadavg()[0]:.1f}); "
        f"SIGKILL {chaos.kills}, SIGSTOP {chaos.stops} ({chaos.zombie_stops} longer than TTL); "
        f"claims {stats.claims} (logged {stats.logged_claims}), takeovers by reason {stats.takeovers}, "
        f"discarded publications {stats.discarded}, lost leases (self-fenced) {stats.lost}, "
        f"worker processes {stats.processes}"
    )
    assert chaos.kills >= 1 and stats.takeovers, "the chaos must have forced at least one takeover"
