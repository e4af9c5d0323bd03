"""Matrix row 6: clock jumps and skew between nodes.

Staleness is judged only on the observer's own monotonic clock, and the holder self-fences on
its own monotonic clock, so wall-clock steps (NTP, settimeofday) and skew between nodes can
cause neither a premature takeover nor a stuck claim.  In-process with injected clocks; and
with libfaketime on real worker processes where the Debian package is installed.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from pathlib import Path

import pytest

from data_juicer_elastic.jobdir.heartbeats import Heartbeater
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.task_queue import StalenessObserver, publish_claim, read_lease, takeover_reason
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

from .conftest import driver_cmd, driver_env
from .fakes import done_shards, merged_ids, prepare

SHARD = "part-00000-of-00004"
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
DAY = 86400.0


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def jumping_wall_clock(monkeypatch):
    """time.time() jumps a day forward, then back, then a year back, on every call."""
    real = time.time
    offsets = itertools.cycle([DAY, -DAY, -365 * DAY, 0.0])
    monkeypatch.setattr(time, "time", lambda: real() + next(offsets))


def test_wall_clock_jumps_cause_no_premature_takeover_and_no_stuck_claim(tmp_path, jumping_wall_clock):
    job = prepare(tmp_path)
    layout = JobLayout(job)
    holder = WorkerIdentity("holder", "host-a", "boot-a", 11, "pid:[1]")
    observer_id = WorkerIdentity("observer", "host-b", "boot-b", 22, "pid:[2]")
    claim = publish_claim(layout, read_lease(layout, SHARD), holder, holder.new_attempt_id(), "none")
    # Two nodes, two unrelated monotonic clocks (different origins, as on two machines).
    holder_clock, observer_clock = Clock(5.0), Clock(1_000_000.0)
    beats = Heartbeater(layout, claim, heartbeat_secs=2.5, ttl_secs=10.0, clock=holder_clock)
    observer = StalenessObserver(10.0, observer_clock)
    for _ in range(12):  # holder renews every 2.5 s; observer looks every 2.5 s; wall time jumps throughout
        assert beats.beat() and beats.check()
        assert takeover_reason(read_lease(layout, SHARD), observer_id, observer) is None
        holder_clock.now += 2.5
        observer_clock.now += 2.5
    # The holder dies; the wall clock keeps jumping: the observer takes over exactly after TTL.
    observer_clock.now += 7.0  # 9.5 s since the last change it saw
    assert takeover_reason(read_lease(layout, SHARD), observer_id, observer) is None
    observer_clock.now += 0.5
    assert takeover_reason(read_lease(layout, SHARD), observer_id, observer) == "stale"


def test_holder_does_not_self_fence_on_a_wall_clock_jump(tmp_path, jumping_wall_clock):
    job = prepare(tmp_path)
    layout = JobLayout(job)
    me = WorkerIdentity.current("n")
    claim = publish_claim(layout, read_lease(layout, SHARD), me, me.new_attempt_id(), "none")
    clock = Clock(0.0)
    beats = Heartbeater(layout, claim, heartbeat_secs=1.0, ttl_secs=10.0, clock=clock)
    assert beats.beat()
    clock.now += 7.9  # just under ttl - 2h without renewal, whatever time.time() says
    assert beats.check()
    clock.now += 0.2
    assert not beats.check() and "no renewal" in beats.lost_reason


def _faketime_env(node: str, spec_file: Path) -> dict:
    env = driver_env(node=node)
    env.update(
        LD_PRELOAD=str(LIBFAKETIME),
        FAKETIME_TIMESTAMP_FILE=str(spec_file),
        FAKETIME_NO_CACHE="1",
        # CLOCK_MONOTONIC never jumps on a real machine; only the wall clock is stepped here.
        FAKETIME_DONT_FAKE_MONOTONIC="1",
    )
    return env


@pytest.mark.skipif(not LIBFAKETIME.exists(), reason="libfaketime not installed (Debian package faketime)")
def test_real_workers_with_skewed_and_jumping_wall_clocks_take_nothing_over(tmp_path):
    job = prepare(tmp_path, rows=40, shards=4)
    skews = {"ahead": tmp_path / "ahead.faketime", "behind": tmp_path / "behind.faketime"}
    skews["ahead"].write_text("+1d\n")
    skews["behind"].write_text("-3d\n")
    # A TTL far above the heartbeat: only a clock bug, not a loaded machine, could cause a takeover.
    args = ["worker", job, "--ttl", "8", "--heartbeat", "1", "--sleep", "1.2"]
    procs = {
        node: subprocess.Popen(
            driver_cmd(*args), env=_faketime_env(node, spec), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for node, spec in skews.items()
    }
    time.sleep(1.5)
    skews["ahead"].write_text("-1d\n")  # a step of two days backwards in the middle of a shard
    skews["behind"].write_text("+2d\n")  # and five days forwards on the other node
    for proc in procs.values():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    done = done_shards(job)
    assert len(done) == 4
    assert all(r["generation"] == 1 for r in done.values()), "no shard was taken over"
    assert {r["node_id"] for r in done.values()} == set(skews), "both nodes worked"
    assert not (job / "failures").exists() or not list((job / "failures").rglob("*.json"))
    # the fake clocks were in effect: claim times are days apart from the real clock
    claimed_at = [json.loads(p.read_bytes())["claimed_at"] for p in (job / "claims").rglob("gen-*.json")]
    assert all(abs(t - time.time()) > 0.9 * DAY for t in claimed_at), claimed_at
    out_path = tmp_path / "out.jsonl"
    merged = subprocess.run(driver_cmd("merge", job, out_path), env=driver_env(), capture_output=True, text=True)
    assert merged.returncode == 0 and merged_ids(out_path) == list(range(40))
