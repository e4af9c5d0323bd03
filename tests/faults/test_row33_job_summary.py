"""Fault matrix row 33: the job summary itself fails; no shard is lost, duplicated or taken over.

Real worker processes (the worker loop, leases and summary keeper of the package, the fast fake
runner instead of Ray) share a job while the summary is attacked:

* its writer is SIGKILLed while holding a shard: another process takes the writer's lease over,
  the killed holder's shard is taken over like any dead holder's, the job completes;
* the summary and its brief (what workers read) are torn, deleted, a byte of the brief flipped,
  an old round put back, or a brief forged (checksum intact, named by the sequence) that vouches
  for every live claim with a heartbeat value never written, over and over, while the workers run:
  they fall back to the walk or trust a stale hint for a while; no live claim is ever taken over
  (every shard's accepted result is generation 1), every row is merged exactly once, in order;
* two writers at once: the writer is frozen (SIGSTOP) past the TTL, another takes the lease over,
  the frozen one resumes (SIGCONT): once the new generation has written, the old one writes at most
  the round it was inside (its rounds are fenced), no reader takes that round up after the new
  generation's, and its held shard is abandoned, not published twice.

The oracle is the input itself (merged rows) and the job directory's own records (claims, done
markers), never the summary.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
import zlib
from pathlib import Path

import pytest

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.job_summary import SummaryReader
from data_juicer_elastic.jobdir.layout import ROLE_TASK, JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import record_checksum
from data_juicer_elastic.jobdir.task_queue import read_lease

from .conftest import dj_elastic_status, run_driver, start_driver
from .fakes import done_shards, merged_ids, prepare

pytestmark = [pytest.mark.slow]

TTL = ["--ttl", "3", "--heartbeat", "0.5"]


def _wait_for(predicate, procs, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        for proc in procs:
            assert proc.poll() is None or proc.returncode == 0, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _writer(job: Path):
    """(generation, pid) of the summary writer's latest lease, or None."""
    view = read_lease(JobLayout(job).summary_lease, ROLE_TASK)
    return None if view.claim is None else (view.generation, view.claim.pid)


def _held_by(job: Path, pid: int) -> list[str]:
    held = []
    for path in (job / "summary" / "paces").glob("*.json"):
        record = json.loads(path.read_bytes())
        if record["pid"] == pid:
            held += [h["shard_id"] for h in record["held"]]
    return held


def done_by_victim(job: Path, pid: int, shard: str) -> str | None:
    """The victim's node id, if it claimed ``shard`` (so its result could be told from a survivor's)."""
    for path in (job / "claims" / shard).glob("gen-*.json"):
        claim = json.loads(path.read_bytes())
        if claim["pid"] == pid:
            return claim["node_id"]
    return None


def _kill_all(procs) -> None:
    """Whatever a failed test left running (each worker in its own process group)."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _finish(procs) -> list[dict]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _merged_exactly_once(tmp_path: Path, job: Path, rows: int) -> None:
    merged = run_driver("merge", job, tmp_path / "out.jsonl")
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert merged_ids(tmp_path / "out.jsonl") == list(range(rows))


def test_the_writer_sigkilled_while_holding_a_shard(tmp_path):
    job = prepare(tmp_path, rows=60, shards=30)
    procs = [start_driver("worker", job, *TTL, "--sleep", "0.4", node=f"n{k}") for k in range(3)]
    try:
        _wait_for(lambda: _writer(job) is not None and _held_by(job, _writer(job)[1]), procs)
        generation, pid = _writer(job)
        victim = next(p for p in procs if p.pid == pid)
        held = _held_by(job, pid)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        survivors = [p for p in procs if p is not victim]
        summaries = _finish(survivors)
    finally:
        _kill_all(procs)
    assert all(s["complete"] for s in summaries)
    new_generation, new_pid = _writer(job)
    assert new_generation > generation and new_pid != pid  # the lease was taken over
    final = json.loads((job / "summary" / "summary.json").read_bytes())
    assert final["seq"].split(".")[0] != str(generation)
    done = done_shards(job)
    assert len(done) == 30
    died_holding = {  # the victim's claims that no release record ends: it died holding them
        path.parent.name: json.loads(path.read_bytes())["attempt_id"]
        for path in (job / "claims").glob("*/gen-*.json")
        if json.loads(path.read_bytes())["pid"] == pid
        and not (job / "releases" / path.parent.name / path.name).exists()
    }
    assert died_holding, f"the writer was killed holding {held}, yet every claim of it was released"
    for shard, attempt in died_holding.items():
        if done[shard]["attempt_id"] == attempt:
            continue  # killed after publishing this shard's result and before releasing: the shard is done
        # else taken over and run again by a survivor
        assert done[shard]["generation"] >= 2 and done[shard]["node_id"] != done_by_victim(job, pid, shard)
    _merged_exactly_once(tmp_path, job, 60)


def test_a_torn_deleted_or_old_summary_never_takes_a_live_claim(tmp_path):
    job = prepare(tmp_path, rows=80, shards=40)
    procs = [start_driver("worker", job, *TTL, "--sleep", "0.25", node=f"n{k}") for k in range(3)]
    summary, seq = job / "summary" / "summary.json", job / "summary" / "summary.seq"
    brief = job / "summary" / "brief.json.z"  # what the workers read
    stop, rng, attacks = threading.Event(), random.Random(33), []

    def vandal():
        old = None
        while not stop.wait(0.15):
            try:
                current = (summary.read_bytes(), seq.read_bytes(), brief.read_bytes())
            except OSError:
                continue
            try:
                announced, inflated = json.loads(current[1]), json.loads(zlib.decompress(current[2]))
            except (ValueError, zlib.error):
                continue  # caught between two writes, or our own last attack: wait for the writer's next round
            old = old or current
            what = rng.choice(["torn", "delete", "old", "bogus-stale", "torn-brief", "brief-bit-flip"])
            attacks.append(what)
            if what == "torn":
                summary.write_bytes(current[0][: len(current[0]) // 2])
                brief.write_bytes(current[2][: len(current[2]) // 2])
            elif what == "delete":
                summary.unlink(missing_ok=True)
                brief.unlink(missing_ok=True)
            elif what == "old":  # a whole old round put back, the brief its seq named included
                summary.write_bytes(old[0])
                brief.write_bytes(old[2])
                announced["brief"] = json.loads(old[1])["brief"]
            elif what == "bogus-stale":  # a brief (checksum intact, named by the seq) vouching for every
                record = inflated  # live claim with a value never written
                shards = load_manifest(job).shard_ids
                record["stale_tokens"] = {shards[place]: '[1,"seq","forged",1]' for place in record["live_shards"]}
                record["checksum"] = record_checksum({k: v for k, v in record.items() if k != "checksum"})
                brief.write_bytes(zlib.compress(json.dumps(record).encode()))
                announced["brief"] = record["checksum"]
            elif what == "torn-brief":  # a brief cut short, as a crash mid-copy would leave it
                brief.write_bytes(current[2][: max(1, len(current[2]) - 7)])
            else:  # one byte of the compressed brief flipped
                damaged = bytearray(current[2])
                damaged[rng.randrange(len(damaged))] ^= 0x10
                brief.write_bytes(bytes(damaged))
            announced["seq"] += f"-{len(attacks)}"  # a new sequence: readers take the vandalised round up
            seq.write_bytes(json.dumps(announced).encode())

    thread = threading.Thread(target=vandal, daemon=True)
    try:
        _wait_for(lambda: summary.exists(), procs)
        thread.start()
        summaries = _finish(procs)
    finally:
        stop.set()
        _kill_all(procs)
    assert len(attacks) >= 6 and all(s["complete"] for s in summaries)
    done = done_shards(job)
    assert len(done) == 40
    # nobody died, so no claim may have been taken over whatever the summary said
    assert {d["generation"] for d in done.values()} == {1}
    assert not any((job / "failures").glob("*/*.json"))
    assert sum(s["done"] for s in summaries) == 40 and sum(s["discarded"] for s in summaries) == 0
    _merged_exactly_once(tmp_path, job, 80)


def test_two_writers_at_once_the_frozen_one_is_fenced(tmp_path):
    job = prepare(tmp_path, rows=60, shards=30)
    procs = [start_driver("worker", job, *TTL, "--sleep", "0.3", node=f"n{k}") for k in range(3)]
    seen: list[str] = []  # the sequence file, as written
    taken: list[str] = []  # the rounds a worker's reader takes up
    stop = threading.Event()

    def watch_seq():
        reader = None
        while not stop.wait(0.02):
            try:
                value = json.loads((job / "summary" / "summary.seq").read_bytes())["seq"]
                reader = reader or SummaryReader(JobLayout(job), load_manifest(job), ttl_secs=3.0, min_interval=0.0)
            except (OSError, ValueError, JobDirError):
                continue
            if not seen or seen[-1] != value:
                seen.append(value)
            view = reader.view()
            if view is not None and (not taken or taken[-1] != view.seq):
                taken.append(view.seq)

    watcher = threading.Thread(target=watch_seq, daemon=True)
    watcher.start()
    try:
        _wait_for(lambda: _writer(job) is not None, procs)
        generation, pid = _writer(job)
        frozen = next(p for p in procs if p.pid == pid)
        os.killpg(frozen.pid, signal.SIGSTOP)
        try:
            others = [p for p in procs if p is not frozen]
            _wait_for(lambda: _writer(job)[0] > generation and seen and seen[-1].split(".")[0] != str(generation),
                      others)  # fmt: skip
        finally:
            os.killpg(frozen.pid, signal.SIGCONT)
        summaries = _finish(procs)
    finally:
        stop.set()
        _kill_all(procs)
    watcher.join(timeout=5)
    generations = [int(s.split(".")[0]) for s in seen]
    first_new = next(i for i, g in enumerate(generations) if g > generation)
    # Fenced before every round and again before writing it, the old writer writes at most the round it
    # was inside when it was stopped (a write cannot be fenced while it runs) ...
    assert sum(g <= generation for g in generations[first_new:]) <= 1, seen
    # ... and no reader takes that round up once it has read the new generation's.
    taken_generations = [int(s.split(".")[0]) for s in taken]
    if any(g > generation for g in taken_generations):
        first_taken = next(i for i, g in enumerate(taken_generations) if g > generation)
        assert all(g > generation for g in taken_generations[first_taken:]), taken
    assert all(s["complete"] for s in summaries)
    done = done_shards(job)
    assert len(done) == 30
    assert sum(s["done"] for s in summaries) == 30  # every shard accepted once
    _merged_exactly_once(tmp_path, job, 60)


def test_a_worker_killed_between_its_done_marker_and_its_pace_record_is_still_counted(tmp_path):
    """Killed right after linking its second result (`published@2`): its pace record never counts
    that shard. `status` from the summary (text and --json, without --all) still reconciles with
    the done markers and the merged output: every done shard in a node's row, every output row."""
    job = prepare(tmp_path, rows=40, shards=4)
    victim = run_driver("worker", job, "--ttl", "2", "--sleep", "0.5", node="victim", crash="published@2")
    assert victim.returncode == -signal.SIGKILL, victim.stderr[-3000:]
    rescuer = run_driver("worker", job, "--ttl", "2", "--sleep", "0.5", node="rescuer")
    assert rescuer.returncode == 0, rescuer.stderr[-3000:]
    _merged_exactly_once(tmp_path, job, 40)
    out_rows = len(merged_ids(tmp_path / "out.jsonl"))
    by_node = {}
    for record in done_shards(job).values():  # the oracle: the done markers themselves
        by_node.setdefault(record["node_id"], []).append(record)
    assert len(by_node["victim"]) == 2, "the victim published two results before it died"

    proc = dj_elastic_status(job, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["source"] == "summary" and data["counts"]["done"] == 4 and data["complete"]
    assert data["output_rows"] == out_rows == 40 and data["quarantined_rows"] == 0
    nodes = {n["node_id"]: n for n in data["nodes"]}
    assert sum(n["shards_done"] for n in nodes.values()) == data["counts"]["done"]
    for node, records in by_node.items():
        assert nodes[node]["shards_done"] == len(records), node
        assert nodes[node]["output_rows"] == sum(r["rows"] for r in records), node
        assert nodes[node]["rows_done"] == sum(r["input_rows"] for r in records), node

    text = dj_elastic_status(job)
    assert text.returncode == 0, text.stderr[-3000:]
    assert f"40/40 input rows done, {out_rows} output rows" in text.stdout
    victim_row = next(line for line in text.stdout.splitlines() if line.strip().startswith("victim "))
    assert victim_row.split()[3:6] == ["2", str(sum(r["input_rows"] for r in by_node["victim"])),
                                       str(sum(r["rows"] for r in by_node["victim"]))]  # fmt: skip
