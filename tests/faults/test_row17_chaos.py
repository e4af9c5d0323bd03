"""Fault matrix row 17: random SIGKILLs of whole workers, with replacements.

Three ``dj-elastic worker`` processes (real Ray, each in its own process group) share 20
shards of a slow operator under a short lease TTL.  Once the fleet is working (a first shard
done), every 4-8 s (seeded) a random worker's whole process group is killed and a
replacement started, until a bounded number of kills, or earlier once three of them hit a
worker holding a shard.  (A replacement needs its imports, the code check and a Ray start
before it can claim, ~15 s on a loaded 2-core test machine: kills much faster than that
would only ever hit starting workers.)  Then the workers finish on their
own, and the job completes with no manual step: no terminally failed shard, no ``retry``,
the merge holds every input row exactly once, in order.

What makes it survive: a holder's death is not an execution failure (its own, larger
budget), a fresh worker starts at a random pending shard, and it claims only once its Ray
runtime is ready (a worker killed while starting holds nothing).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from .commands import dj_elastic, env, merged_rows, slow_job

pytestmark = [pytest.mark.ray]

SEED = int(os.environ.get("DJ_ELASTIC_CHAOS_SEED", "1317"))
SHARDS, ROWS = 20, 80
WORKERS = 3
MAX_KILLS = 8  # the bound: the kill phase ends here, or earlier once HOLDER_KILLS holders were hit
HOLDER_KILLS = 3
KILL_EVERY = (4.0, 8.0)  # seconds between kills, drawn from the seeded generator


class Fleet:
    """The running workers; each in its own session, so a kill takes its Ray runtime too."""

    def __init__(self, job: Path, logs: Path):
        self.job, self.logs, self.started = job, logs, 0
        self.procs: list[subprocess.Popen] = []
        self.orphans: list[psutil.Process] = []

    def start(self) -> None:
        self.started += 1
        log = open(self.logs / f"worker-{self.started}.log", "w")
        self.procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "data_juicer_elastic.cli", "worker", "--job-dir", str(self.job)],
                env=env({"DJ_ELASTIC_NODE_ID": f"chaos-{self.started}"}),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()

    def live(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def kill(self, victim: subprocess.Popen) -> None:
        try:
            family = psutil.Process(victim.pid).children(recursive=True)
        except psutil.Error:
            family = []
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        self.procs.remove(victim)
        self.orphans += family  # checked (and cleaned up) at the end

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for proc in self.orphans:
            try:
                proc.kill()
            except psutil.Error:
                pass


def _holds_a_shard(job: Path, pid: int) -> bool:
    """Whether ``pid`` holds the latest claim of a shard that is not finished yet."""
    for shard_dir in (job / "claims").iterdir():
        gens = sorted(shard_dir.glob("gen-*.json"))
        if not gens or (job / "done" / f"{shard_dir.name}.json").exists():
            continue
        latest = gens[-1]
        try:
            claim = json.loads(latest.read_bytes())
        except (OSError, ValueError):
            continue
        if claim["pid"] == pid and not (job / "releases" / shard_dir.name / latest.name).exists():
            return True
    return False


def _done(job: Path) -> int:
    return len(list((job / "done").glob("part-*.json")))


@pytest.mark.extended
def test_random_kills_of_whole_workers_with_replacements_finish_exactly_once(tmp_path):
    rng = random.Random(SEED)
    elastic = {"num_shards": SHARDS, "lease_ttl_secs": 6, "heartbeat_interval_secs": 1, "poll_interval_secs": 0.5}
    job = slow_job(tmp_path, ROWS, 0.5, **elastic)
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = Fleet(job, logs)
    t0 = time.monotonic()
    kills = holder_kills = 0
    try:
        for _ in range(WORKERS):
            fleet.start()
        warm = time.monotonic() + 600
        while _done(job) == 0:  # the kills start once the fleet works (a deadline, not a timing assertion)
            assert time.monotonic() < warm and fleet.live(), "no shard was ever done: " + _tail(logs)
            time.sleep(0.2)
        while kills < MAX_KILLS and holder_kills < HOLDER_KILLS and _done(job) < SHARDS - 2:
            time.sleep(rng.uniform(*KILL_EVERY))  # the kill schedule (seeded), not a timing assertion
            if _done(job) >= SHARDS - 2:  # the fleet got there while we waited: the kill phase is over
                break
            live = fleet.live()
            assert live, "every worker exited during the kill phase: " + _tail(logs)
            victim = rng.choice(sorted(live, key=lambda p: p.pid))
            holder = _holds_a_shard(job, victim.pid)
            fleet.kill(victim)
            kills += 1
            holder_kills += holder
            fleet.start()  # the replacement a scheduler would start
        assert holder_kills >= 1, f"no kill hit a worker holding a shard in {kills} kills: nothing was tested"

        finish = time.monotonic() + 600
        for worker in list(fleet.procs):
            code = worker.wait(timeout=max(1.0, finish - time.monotonic()))
            assert code == 0, f"a worker exited {code}: " + _tail(logs)
        elapsed = time.monotonic() - t0
        print(f"chaos seed {SEED}: {kills} kills ({holder_kills} of holders), {fleet.started} workers, {elapsed:.0f}s")
    finally:
        fleet.stop_all()

    assert not (job / "failed").exists() or not list((job / "failed").iterdir()), "a shard failed terminally"
    assert not (job / "history").exists(), "nobody ran retry"
    status = dj_elastic("status", "--job-dir", job)
    assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
    deaths = [
        json.loads(p.read_bytes())["exit_reason"]
        for p in job.glob("failures/*/gen-*.json")
        if json.loads(p.read_bytes())["exit_reason"] != "error"
    ]
    assert len(deaths) >= 1, "a killed holder's shard is taken over under a new generation, recorded as a death"
    ids = [row["id"] for row in merged_rows(job, tmp_path / "merged.jsonl")]
    assert ids == list(range(ROWS)), "every row exactly once, in input order"
    assert dj_elastic("verify", "--job-dir", job).returncode == 0


def _tail(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(logs.iterdir()))
