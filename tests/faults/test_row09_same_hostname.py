"""Matrix row 9: two workers with the same hostname (and node id).

Identities still differ (pid, pid namespace, boot id, a random attempt id), every shard is
done once, and nobody releases or takes over another's live claim.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess

import pytest

from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.task_queue import StalenessObserver, holder_dead_here, publish_claim, read_lease
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

from .conftest import driver_cmd, driver_env
from .fakes import done_shards, merged_ids, prepare

HOST = "twin-host"


def _uts_namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--uts", "hostname", HOST], capture_output=True)
    return probe.returncode == 0


def _twin(job, *args):
    """A worker in its own UTS namespace whose hostname is HOST (as two containers would be)."""
    cmd = " ".join(map(shlex.quote, driver_cmd("worker", job, *args)))
    return subprocess.Popen(
        ["unshare", "--uts", "sh", "-c", f"hostname {HOST} && exec {cmd}"],
        env=driver_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.skipif(not _uts_namespaces_work(), reason="unshare --uts is not permitted here")
def test_two_workers_with_one_hostname_do_every_shard_once_and_release_only_their_own(tmp_path):
    job = prepare(tmp_path, rows=40, shards=8)
    twins = [_twin(job, "--sleep", "0.3") for _ in range(2)]
    summaries = []
    for proc in twins:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    assert all(s["done"] > 0 for s in summaries), f"both twins worked: {summaries}"
    assert sum(s["done"] for s in summaries) == 8

    claims = [json.loads(p.read_bytes()) for p in sorted((job / "claims").rglob("gen-*.json"))]
    assert len(claims) == 8 and all(c["generation"] == 1 for c in claims), "no takeover between twins"
    assert {c["hostname"] for c in claims} == {HOST} and {c["node_id"] for c in claims} == {HOST}
    assert len({c["pid"] for c in claims}) == 2, "identities differ by pid"
    assert len({c["attempt_id"] for c in claims}) == 8
    for claim in claims:  # each release names the attempt that held the claim
        release = json.loads((job / "releases" / claim["shard_id"] / "gen-000001.json").read_bytes())
        assert release["attempt_id"] == claim["attempt_id"] and release["reason"] == "finished"
    assert len(done_shards(job)) == 8
    out = tmp_path / "out.jsonl"
    assert subprocess.run(driver_cmd("merge", job, out), env=driver_env()).returncode == 0
    assert merged_ids(out) == list(range(40))


def test_same_hostname_on_another_kernel_or_namespace_is_never_judged_dead_by_pid(tmp_path):
    job = prepare(tmp_path)
    layout = JobLayout(job)
    me = WorkerIdentity.current("n")
    dead_pid = 2**22 + 7  # above pid_max: exists nowhere here
    cases = {
        "part-00000-of-00004": (me.boot_id, "pid:[999]", False),  # another container on this kernel
        "part-00001-of-00004": ("another-boot", me.pid_namespace, False),  # another machine, same name
        "part-00002-of-00004": (me.boot_id, me.pid_namespace, True),  # really here, and dead
    }
    for shard, (boot, ns, dead) in cases.items():
        twin = WorkerIdentity(me.node_id, me.hostname, boot, dead_pid, ns)
        publish_claim(layout, read_lease(layout, shard), twin, twin.new_attempt_id(), "none")
        assert holder_dead_here(read_lease(layout, shard), me) is dead, shard
    # a live twin in our own namespace is never taken over before the TTL
    live = WorkerIdentity(me.node_id, me.hostname, me.boot_id, 1, me.pid_namespace)
    publish_claim(layout, read_lease(layout, "part-00003-of-00004"), live, live.new_attempt_id(), "none")
    view = read_lease(layout, "part-00003-of-00004")
    assert not holder_dead_here(view, me) and not StalenessObserver(60.0).is_stale(view)
