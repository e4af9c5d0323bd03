from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_juicer_elastic.errors import ConfigError, JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout, parse_gen_name, parse_shard_id, shard_id, validate_attempt_id
from data_juicer_elastic.sharedfs.identity import WorkerIdentity, pid_alive


def test_shard_id_format_and_round_trip():
    assert shard_id(3, 16) == "part-00003-of-00016"
    assert parse_shard_id("part-00003-of-00016") == (3, 16)
    with pytest.raises(ConfigError):
        shard_id(0, 100_000)


@pytest.mark.parametrize(
    "bad", ["../etc", "part-3-of-16", "part-00016-of-00016", "part-00001-of-00016/..", "/abs", "", None]
)
def test_untrusted_shard_ids_are_refused(tmp_path, bad):
    layout = JobLayout(tmp_path)
    with pytest.raises(JobDirError):
        layout.shard(bad)
    with pytest.raises(JobDirError):
        layout.done(bad)


def test_paths_match_the_documented_layout(tmp_path):
    layout = JobLayout(tmp_path)
    sid = "part-00001-of-00002"
    assert layout.claim(sid, 1) == tmp_path / "claims" / sid / "gen-000001.json"
    assert layout.heartbeat(sid, 2) == tmp_path / "heartbeats" / sid / "gen-000002.json"
    assert layout.release(sid, 3).parent == tmp_path / "releases" / sid
    assert layout.failure(sid, 1).parent == tmp_path / "failures" / sid
    assert layout.attempt_dir(sid, "a-1") == tmp_path / "attempts" / sid / "a-1"
    assert layout.done(sid) == tmp_path / "done" / f"{sid}.json"
    assert layout.failed(sid) == tmp_path / "failed" / f"{sid}.json"
    assert layout.manifest.name == "manifest.json" and layout.merge_record.name == "merge.json"
    assert layout.cache_dir == tmp_path / "cache"
    with pytest.raises(JobDirError):
        layout.attempt_dir(sid, "../x")
    with pytest.raises(JobDirError):
        layout.resolve_relative("../outside")
    assert parse_gen_name("gen-000042.json") == 42
    assert parse_gen_name(".gen-000042.json.tmp-1-ab") is None


def test_identity_reads_env_and_attempt_ids_are_unique(monkeypatch):
    monkeypatch.setenv("DJ_ELASTIC_NODE_ID", "node-from-env")
    me = WorkerIdentity.current()
    assert me.node_id == "node-from-env" and me.pid == os.getpid() and me.boot_id
    assert WorkerIdentity.current("explicit").node_id == "explicit"
    ids = {me.new_attempt_id() for _ in range(500)}
    assert len(ids) == 500
    JobLayout("/x").attempt_dir("part-00000-of-00001", next(iter(ids)))  # filesystem-safe


def test_unsafe_node_names_give_safe_attempt_ids():
    me = WorkerIdentity("../we ird/node", "h", "b", 1)
    attempt = me.new_attempt_id()
    assert "/" not in attempt and ".." not in attempt and " " not in attempt
    assert validate_attempt_id(attempt) == attempt  # the check every record's attempt id must pass
    path = JobLayout("/x").attempt_dir("part-00000-of-00001", attempt)
    assert path.parent == Path("/x/attempts/part-00000-of-00001") and path.name == attempt
    assert me.new_attempt_id() != attempt, "unique per call"


def test_pid_alive_and_namespace_rule():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_alive(proc.pid)
    assert pid_alive(os.getpid())
    me = WorkerIdentity.current()
    assert me.same_kernel_namespace(me.hostname, me.boot_id, me.pid_namespace) == bool(me.pid_namespace)
    assert not me.same_kernel_namespace(me.hostname, me.boot_id, "pid:[1]")
    assert not me.same_kernel_namespace("other-host", me.boot_id, me.pid_namespace)
