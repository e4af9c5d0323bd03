"""Fault matrix row 8: NFS-like cache lag.

Two bindfs FUSE views of one job directory, each with attribute, entry and negative
lookup caching of ``CACHE_SECS``: a file created through one view stays invisible
through the other for up to that long, and attributes lag, as on NFS.  Worker processes
alternate between the views.  With TTL = 3 x (cache time + heartbeat interval), the
rule in docs/failure-semantics.md, the job must still be exactly-once and no claim may
be taken over as stale unless its holder was really killed.  Skipped, with the reason,
where FUSE cannot be mounted (no bindfs, no /dev/fuse, or mounting is not permitted).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from .race_harness import Chaos, Lease, check_exactly_once, prepare

CACHE_SECS = 1.0
HEARTBEAT = 0.5
TTL = 3 * (CACHE_SECS + HEARTBEAT)
PROCESSES, SHARDS = 4, 16


def _unmount(path: Path) -> None:
    for cmd in (["fusermount3", "-u", str(path)], ["fusermount", "-u", str(path)], ["umount", "-l", str(path)]):
        if shutil.which(cmd[0]) and subprocess.run(cmd, capture_output=True).returncode == 0:
            return


@pytest.fixture
def cached_views(tmp_path):
    """(backing dir, view a, view b): two caching FUSE views of one directory."""
    if shutil.which("bindfs") is None:
        pytest.skip("bindfs is not installed (apt-get install -y bindfs fuse3; .ci/run installs it)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse does not exist in this environment: FUSE cannot be mounted")
    backing = tmp_path / "backing"
    views = [tmp_path / "view-a", tmp_path / "view-b"]
    for path in (backing, *views):
        path.mkdir()
    cache = f"attr_timeout={CACHE_SECS},entry_timeout={CACHE_SECS},negative_timeout={CACHE_SECS}"
    mounted = []
    try:
        for view in views:
            proc = subprocess.run(["bindfs", "-o", cache, str(backing), str(view)], capture_output=True, text=True)
            if proc.returncode != 0:
                pytest.skip(f"bindfs could not mount a FUSE view (exit {proc.returncode}): {proc.stderr.strip()}")
            mounted.append(view)
        yield backing, views[0], views[1]
    finally:
        for view in mounted:
            _unmount(view)


def test_views_really_lag(cached_views):
    """The rig itself: without visible caching the test below would prove nothing."""
    _, a, b = cached_views
    assert not (a / "probe").exists()  # a negative lookup, now cached in view a
    (b / "probe").write_text("x")
    assert not (a / "probe").exists(), "view a should still see its cached negative lookup"
    time.sleep(CACHE_SECS + 0.5)
    assert (a / "probe").read_text() == "x"


@pytest.mark.slow
def test_exactly_once_and_no_spurious_takeover_through_lagging_views(cached_views, tmp_path):
    backing, a, b = cached_views
    rows = prepare(tmp_path, backing / "job", SHARDS)
    # Shards take longer than the cache time, so heartbeats and claims cross the caches.
    lease = Lease(ttl=TTL, heartbeat=HEARTBEAT, work_secs=2 * CACHE_SECS)
    chaos = Chaos(tmp_path, [a / "job", b / "job"], lease, seed=3)
    # Kill one holder that plays another node (odd slots): only the TTL rule, read through the
    # caches, can free its shard; the takeover that follows is legitimate, any other is not.
    elapsed = chaos.run(PROCESSES, kill_budget=1, stop_budget=0, chaos_until=0.3, victims={1, 3})
    stats = check_exactly_once(backing / "job", chaos.histories, rows, tmp_path / "merged.jsonl")
    print(
        f"\nnfs lag: cache {CACHE_SECS}s, TTL {TTL}s, {PROCESSES} processes over 2 views, {SHARDS} shards, "
        f"{elapsed:.1f}s; SIGKILL {chaos.kills}; takeovers {stats.takeovers}; "
        f"discarded publications {stats.discarded}; lost leases {stats.lost}"
    )
    spurious = [t for t in stats.stale_takeovers if t not in chaos.faulted]
    assert not spurious, f"live claims taken over as stale through the caches: {spurious}"
    # the killed holder's shard is taken over, and the one it held ahead (claim-ahead), if any
    assert chaos.kills == 1 and 1 <= len(chaos.faulted) <= 2
    assert stats.takeovers.get("stale") == len(chaos.faulted), "the killed holder's shards are taken over"
    assert stats.discarded == 0 and "released" not in stats.takeovers, "a finished shard was run again"


def test_a_finished_release_is_not_taken_over_before_a_ttl(tmp_path):
    """Regression (found by the test above: a shard re-run and its result discarded): a holder
    released "finished", but this node's cache does not show the done marker yet.  Taking over
    at once re-ran a finished shard; now the observer waits a TTL on its own clock first."""
    from data_juicer_elastic.jobdir import task_queue
    from data_juicer_elastic.jobdir.layout import JobLayout
    from data_juicer_elastic.jobdir.records import ReleaseReason, TakeoverReason
    from tests.jobdir.conftest import FakeClock, identity

    job = tmp_path / "job"
    prepare(tmp_path, job, 2)
    layout, shard, clock = JobLayout(job), "part-00000-of-00002", FakeClock()
    holder, observer = identity("a", boot_id="boot-a"), task_queue.StalenessObserver(TTL, clock)
    claim = task_queue.publish_claim(layout, task_queue.read_lease(layout, shard), holder, "a1", TakeoverReason.FIRST)
    task_queue.release_claim(layout, claim, ReleaseReason.FINISHED)  # its done marker: not visible here
    me = identity("b", boot_id="boot-b")
    assert task_queue.takeover_reason(task_queue.read_lease(layout, shard), me, observer) is None
    clock.advance(TTL - 0.1)
    assert task_queue.takeover_reason(task_queue.read_lease(layout, shard), me, observer) is None
    clock.advance(0.2)
    assert task_queue.takeover_reason(task_queue.read_lease(layout, shard), me, observer) == TakeoverReason.RELEASED
    other = task_queue.publish_claim(layout, task_queue.read_lease(layout, "part-00001-of-00002"), holder, "a2", "none")
    task_queue.release_claim(layout, other, "signal")  # any other release frees the shard at once
    fresh = task_queue.StalenessObserver(TTL, clock)
    assert (
        task_queue.takeover_reason(task_queue.read_lease(layout, "part-00001-of-00002"), me, fresh)
        == TakeoverReason.RELEASED
    )
