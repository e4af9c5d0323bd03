"""The job summary: what its writer composes, what claimers, idle workers and the gate read from
it, the writer's lease, and a summary that is missing, torn, old or not advancing.

Oracles: the job directory's own records (done markers, leases) and the walk without a summary."""

from __future__ import annotations

import json
import random
import time
import zlib
from pathlib import Path

import pytest

from data_juicer_elastic.coordination.stragglers import ClaimGate
from data_juicer_elastic.jobdir import claiming, heartbeats, task_queue
from data_juicer_elastic.jobdir.job_summary import (
    PaceWriter,
    SummaryReader,
    SummaryView,
    fresh_for,
    read_brief,
    read_pace,
    read_summary,
    register_reader,
)
from data_juicer_elastic.jobdir.layout import ROLE_TASK, JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import ShardResult, TakeoverReason, record_checksum
from data_juicer_elastic.jobdir.roles import SILENT_INTERVALS, SummaryKeeper
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.sharedfs import fault_seam, fsio

from .conftest import copy_runner, identity, make_rows, request, write_rows

TTL, BEAT = 8.0, 2.0
WEIGHT = {"makedirs": 3, "write": 0}


class Ops:
    def __init__(self):
        self.count, self.trace = 0, []

    def __call__(self, op: str, path: Path) -> None:
        self.count += WEIGHT.get(op, 1)
        self.trace.append((op, str(path)))


def counted(call):
    ops = Ops()
    fault_seam.set_fault_hook(ops)
    try:
        result = call()
    finally:
        fault_seam.set_fault_hook(None)
    return result, ops


def _job(tmp_path: Path, shards: int, *, done: int = 0, held: int = 0, name: str = "job"):
    """One row per shard; the first ``done`` shards done by 'other-1', the next ``held`` held by live peers
    on other hosts, each with a heartbeat and a pace record; the rest never claimed."""
    job = tmp_path / name
    prepare_job(request(job, write_rows(tmp_path / f"{name}.jsonl", make_rows(shards)), shards))
    layout, manifest = JobLayout(job), load_manifest(job)
    fsio.makedirs(layout.done_dir)
    for entry in manifest.shards[:done]:
        result = ShardResult(entry.shard_id, "other-1", 1, "peer", entry.rows, 1, "0" * 64, "x", entry.rows, "0", 1.0)
        fsio.write_new(layout.done(entry.shard_id), result.encode(), durable=False)
    peers = []
    for k, entry in enumerate(manifest.shards[done : done + held]):
        peer = identity(f"peer-{k}", pid=50_000 + k, hostname=f"host-{k}", boot_id=f"boot-{k}")
        claim = task_queue.publish_claim(
            layout, task_queue.read_lease(layout, entry.shard_id), peer, f"p-{k}", TakeoverReason.FIRST
        )
        heartbeats.write_heartbeat(layout, claim, 1)
        pace = PaceWriter(layout, peer)
        pace.holding(claim.shard_id, claim.generation, claim.attempt_id)
        pace.flush()
        peers.append((peer, claim))
    return job, layout, manifest, peers


def _keeper(layout, manifest, clock, node="writer", pid=40_000):
    me = identity(node, pid=pid, hostname=f"host-{node}", boot_id=f"boot-{node}")  # only staleness frees its lease
    reader = SummaryReader(layout, manifest, ttl_secs=TTL, clock=clock, min_interval=0.0)
    return SummaryKeeper(layout, manifest, me, PaceWriter(layout, me), reader, ttl_secs=TTL, heartbeat_secs=BEAT,
                         clock=clock)  # fmt: skip


def advance(clock, secs, *writers):
    """Move the clock; the writers renew their lease as their heartbeat thread would have meanwhile."""
    clock.advance(secs)
    for keeper in writers:
        if keeper.role.heartbeater is not None:
            keeper.role.heartbeater.beat()


def seen_advancing(reader, keeper):
    """The reader sees the summary change (one it only saw once could be a dead writer's)."""
    reader.view()
    keeper.tick()
    assert reader.view() is not None


def _claimer(layout, manifest, clock, *, summary=True, node="idle", pid=30_000):
    reader = SummaryReader(layout, manifest, ttl_secs=TTL, clock=clock, min_interval=0.0) if summary else None
    queue = task_queue.TaskQueue(layout, identity(node, pid=pid), ttl_secs=TTL, clock=clock, max_retries=3)
    return claiming.Claimer(queue, manifest, rng=random.Random(3), summary_reader=reader)


def test_the_summary_matches_the_job_directory(tmp_path, clock):
    job, layout, manifest, peers = _job(tmp_path, 30, done=12, held=5)
    fsio.makedirs(layout.failed_dir)
    fsio.write_new(layout.failed(manifest.shards[20].shard_id), b"{}", durable=False)
    keeper = _keeper(layout, manifest, clock)
    keeper.tick()
    summary = read_summary(layout, manifest)
    view = SummaryView(read_brief(layout), summary.seq, manifest)
    on_disk = {e.shard_id for e in manifest.shards if layout.done(e.shard_id).exists()}
    assert view.done_ids() == on_disk and summary.done_count == 12
    assert view.failed == {manifest.shards[20].shard_id}
    assert {c.shard_id: c.generation for c in summary.live} == {c.shard_id: c.generation for _, c in peers}
    assert not any(c.stale for c in summary.live)  # a new writer watches for a TTL before calling anything stale
    assert view.counts() == {"done": 12, "failed": 1, "running": 5, "stale": 0, "pending": 12}
    assert {n.node_id for n in summary.nodes} == {p.node_id for p, _ in peers} | {"writer"}
    # the brief (what workers read) names each live claim's holder as the claims do
    assert {s: (h.node_id, h.pid, h.stale) for s, h in view.live.items()} == {
        c.shard_id: (p.node_id, p.pid, False) for p, c in peers
    }
    assert {n.node_id for n in view.nodes} == {n.node_id for n in summary.nodes}


@pytest.mark.parametrize("held", [10, 200])
def test_an_idle_poll_reads_the_summary_only_whatever_is_held(tmp_path, clock, held):
    """The tail: every shard done or held by someone else.  With the summary an idle poll reads its
    sequence (and the summary when it changed), never a shard; the walk reads every held shard."""
    job, layout, manifest, _ = _job(tmp_path, 300, done=300 - held, held=held)
    keeper = _keeper(layout, manifest, clock)
    keeper.tick()
    claimer = _claimer(layout, manifest, clock)
    seen_advancing(claimer.summary, keeper)
    (got, finished), first = counted(claimer.claim_next)
    assert got is None and not finished
    assert first.count <= 2 + 1  # seq, summary; the done/ listing is never taken with a summary
    (got, finished), poll = counted(claimer.claim_next)
    assert got is None and not finished and poll.trace == [("read", str(layout.summary_seq))]
    walker = _claimer(layout, manifest, clock, summary=False, node="walker")
    counted(walker.claim_next)
    _, walk = counted(walker.claim_next)
    assert walk.count >= held  # what the summary saves: at least a look per held shard per poll


def test_a_stale_candidate_is_taken_over_only_while_its_heartbeat_is_the_one_the_writer_saw(tmp_path, clock):
    job, layout, manifest, peers = _job(tmp_path, 4, done=3, held=1)
    (_peer, claim), keeper = peers[0], _keeper(layout, manifest, clock)
    keeper.tick()
    taker = _claimer(layout, manifest, clock, node="taker")
    taker.summary.view()  # the taker reads the summary all along
    advance(clock, TTL + 0.1, keeper)
    keeper.tick()
    summary = read_summary(layout, manifest)
    assert [c.stale for c in summary.live] == [True]
    # the holder renews just before the taker reads: its token changed, no takeover
    heartbeats.write_heartbeat(layout, claim, 2)
    got, finished = taker.claim_next()
    assert got is None and not finished
    # the holder is gone for good: the next round watches the new value for a TTL, then vouches
    keeper.tick()
    fresh_taker = _claimer(layout, manifest, clock, node="fresh")  # its own observer never saw the lease
    fresh_taker.summary.view()
    advance(clock, TTL + 0.1, keeper)
    keeper.tick()
    got, _ = fresh_taker.claim_next()
    assert got is not None and got[1].generation == 2 and got[1].takeover_reason == TakeoverReason.STALE
    assert task_queue.read_lease(layout, claim.shard_id).generation == 2


def test_a_summary_never_seen_to_advance_is_not_trusted(tmp_path, clock):
    """A summary left by a writer that is gone (a finished or killed run) shows a shard held by a
    live-looking claim: a new reader walks instead, and finds the shard released."""
    job, layout, manifest, peers = _job(tmp_path, 3, done=2, held=1)
    _keeper(layout, manifest, clock).tick()
    task_queue.release_claim(layout, peers[0][1], task_queue.ReleaseReason.SIGNAL)
    claimer = _claimer(layout, manifest, clock)
    got, _ = claimer.claim_next()
    assert claimer.summary.view() is None
    assert got is not None and got[1].takeover_reason == TakeoverReason.RELEASED


def _flip_a_byte(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0x01
    return bytes(damaged)


def _forged(data: bytes) -> bytes:
    """The brief with a shard shown done that is not, checksum left as it was (damage that inflates)."""
    record = json.loads(zlib.decompress(data))
    record["done_count"] += 1
    return zlib.compress(json.dumps(record).encode())


def _mismatched_columns(data: bytes) -> bytes:
    """A brief whose checksum is right but whose columns do not fit together (a writer's bug)."""
    record = json.loads(zlib.decompress(data))
    record["live_pids"].append(1)
    record["checksum"] = record_checksum(record)
    return zlib.compress(json.dumps(record).encode())


BRIEF_FAULTS = {
    "torn": lambda data: data[: len(data) // 2],
    "truncated by a byte": lambda data: data[:-1],
    "a byte flipped": _flip_a_byte,
    "edited, checksum stale": _forged,
    "columns that do not fit": _mismatched_columns,
    "not compressed": lambda data: zlib.decompress(data),
    "a bomb": lambda data: zlib.compress(b" " * (fsio.MAX_RECORD_BYTES + 10)),
    "empty": lambda data: b"",
}


@pytest.mark.parametrize("fault", ["summary torn", "brief deleted", *BRIEF_FAULTS])
def test_a_torn_or_absent_summary_means_the_walk(tmp_path, clock, fault):
    """Every round is a new sequence, so each reader takes the damaged brief up: it is refused (the
    claimer walks and finds the first free shard) and never shown to the claimer."""
    job, layout, manifest, _ = _job(tmp_path, 10, done=4)
    keeper = _keeper(layout, manifest, clock)
    keeper.tick()
    if fault == "summary torn":
        layout.summary.write_bytes(b'{"format": "dj-elastic/summary", "version": 1, "done": "AAA')
        layout.summary_brief.write_bytes(layout.summary_brief.read_bytes()[:20])
    elif fault == "brief deleted":
        layout.summary_brief.unlink()
    else:
        layout.summary_brief.write_bytes(BRIEF_FAULTS[fault](layout.summary_brief.read_bytes()))
    claimer = _claimer(layout, manifest, clock)
    for round_ in (2, 3):  # rounds the reader sees advance, each naming the brief as it was written
        seq = layout.summary_seq.read_bytes().replace(f'"1.{round_ - 1}"'.encode(), f'"1.{round_}"'.encode())
        layout.summary_seq.write_bytes(seq)
        assert claimer.summary.view() is None
    got, _ = claimer.claim_next()
    assert got is not None and got[0].shard_id == manifest.shards[4].shard_id  # found by the walk


def test_a_brief_the_sequence_does_not_name_is_not_read_as_the_round(tmp_path, clock):
    """A brief put back from an earlier round (intact, of this job) under a newer sequence: the
    sequence names another checksum, so readers do not take it up; the next real round is."""
    job, layout, manifest, peers = _job(tmp_path, 4, done=1, held=1)
    keeper = _keeper(layout, manifest, clock)
    keeper.tick()
    old_brief = layout.summary_brief.read_bytes()
    reader = SummaryReader(layout, manifest, ttl_secs=TTL, clock=clock, min_interval=0.0)
    seen_advancing(reader, keeper)
    shard = peers[0][1].shard_id
    result = ShardResult(shard, "peer-0", 1, "p-0", 1, 1, "0" * 64, "x", 1, "0", 1.0)
    fsio.write_new(layout.done(shard), result.encode(), durable=False)
    keeper.tick()  # the peer's shard is done in this round
    assert reader.view().is_done(1) and shard not in reader.view().live
    fsio.write_new(layout.done(manifest.shards[2].shard_id), result.encode(), durable=False)
    keeper.tick()  # round 1.4: shard 2 done too; its brief is replaced by the old one before a reader looks
    layout.summary_brief.write_bytes(old_brief)  # shows shard 1 held, shard 2 free
    view = reader.view()
    assert view.seq == "1.3" and view.is_done(1) and shard not in view.live  # the last good round
    keeper.tick()
    view = reader.view()
    assert view is not None and view.seq == "1.5" and view.is_done(1) and view.is_done(2)


def test_a_round_that_changed_nothing_workers_read_is_not_read_again(tmp_path, clock):
    """The writer's rounds go on (its sequence advances, so readers keep trusting the summary), but
    a reader reads only ``summary.seq`` while the brief is the one it has; summary.json never."""
    job, layout, manifest, _ = _job(tmp_path, 20, done=5, held=3)
    keeper = _keeper(layout, manifest, clock)
    keeper.tick()
    reader = SummaryReader(layout, manifest, ttl_secs=TTL, clock=clock, min_interval=0.0)
    seen_advancing(reader, keeper)
    assert reader.briefs_read == 1  # the second round's brief is the first's: read once
    for round_ in range(4):
        advance(clock, keeper.interval_secs, keeper)
        keeper.tick()
        view, ops = counted(reader.view)
        assert view is not None and view.seq == f"1.{round_ + 3}"
        assert ops.trace == [("read", str(layout.summary_seq))]
    assert reader.briefs_read == 1
    result = ShardResult(manifest.shards[12].shard_id, "other-1", 1, "peer", 1, 1, "0" * 64, "x", 1, "0", 1.0)
    fsio.write_new(layout.done(manifest.shards[12].shard_id), result.encode(), durable=False)
    keeper.tick()  # a shard done: a new brief
    view, ops = counted(reader.view)
    assert [path for _, path in ops.trace] == [str(layout.summary_seq), str(layout.summary_brief)]
    assert view.is_done(12) and reader.briefs_read == 2


def test_an_old_summary_is_trusted_only_for_a_while(tmp_path, clock):
    """A summary put back from the past shows a free shard as held: claimers skip it while the summary
    is fresh, then (it stops advancing) walk, and claim it: delayed, never lost."""
    job, layout, manifest, peers = _job(tmp_path, 3, done=2, held=1)
    keeper = _keeper(layout, manifest, clock)
    keeper.tick()
    old_summary, old_seq = layout.summary.read_bytes(), layout.summary_seq.read_bytes()
    old_brief = layout.summary_brief.read_bytes()
    claimer = _claimer(layout, manifest, clock)
    seen_advancing(claimer.summary, keeper)
    assert claimer.claim_next() == (None, False)  # held, says the summary (truly, this time)
    task_queue.release_claim(layout, peers[0][1], task_queue.ReleaseReason.SIGNAL)  # the holder gave it back
    layout.summary.write_bytes(old_summary)
    layout.summary_brief.write_bytes(old_brief)  # the whole round, the brief its seq names included
    layout.summary_seq.write_bytes(old_seq.replace(b'"1.1"', b'"9.9"'))
    assert claimer.claim_next() == (None, False)
    reader = claimer.summary
    assert fresh_for(TTL, reader.interval_secs) <= TTL  # never longer than one TTL
    clock.advance(reader.fresh_secs)
    got, _ = claimer.claim_next()
    assert got is not None and got[1].takeover_reason == TakeoverReason.RELEASED


def test_a_silent_writer_is_replaced_and_a_writer_that_lost_its_lease_stops(tmp_path, clock):
    job, layout, manifest, _ = _job(tmp_path, 6, done=2)
    a, b = _keeper(layout, manifest, clock, "a", 41_000), _keeper(layout, manifest, clock, "b", 42_000)
    a.tick()
    b.tick()
    assert a.writing and not b.writing and read_summary(layout, manifest).seq == "1.1"
    a.role.heartbeater.stop()  # a freezes: no heartbeat, no rounds
    clock.advance(SILENT_INTERVALS * b.interval_secs)
    b.tick()  # silent: b starts watching the writer's lease (a TTL on its own clock)
    assert not b.writing
    clock.advance(TTL)
    b.tick()
    assert b.writing and read_summary(layout, manifest).seq == "2.1"
    lease = task_queue.read_lease(layout.summary_lease, ROLE_TASK)
    assert lease.generation == 2 and lease.claim.takeover_reason == TakeoverReason.STALE
    a.tick()  # a wakes up: its lease is overdue and a newer generation exists; it writes nothing
    assert not a.writing and read_summary(layout, manifest).seq == "2.1"
    # two writers at once: c takes the lease over while b still writes; b stops at its next round
    c = _keeper(layout, manifest, clock, "c", 43_000)
    view = task_queue.read_lease(layout.summary_lease, ROLE_TASK)
    c.role.claim = task_queue.publish_claim(layout.summary_lease, view, c.identity, "c-1", TakeoverReason.STALE)
    c.role.heartbeater = heartbeats.Heartbeater(
        layout.summary_lease, c.role.claim, heartbeat_secs=BEAT, ttl_secs=TTL, clock=clock
    )
    c.role.heartbeater.beat()
    b.tick()
    assert not b.writing
    c.tick()
    assert read_summary(layout, manifest).seq == "3.1"


def test_a_leaving_writer_releases_its_lease_and_the_next_writes_at_once(tmp_path, clock):
    job, layout, manifest, _ = _job(tmp_path, 4, done=1)
    a, b = _keeper(layout, manifest, clock, "a", 41_000), _keeper(layout, manifest, clock, "b", 42_000)
    a.tick()
    b.tick()  # b reads the summary all along
    a.stop()
    assert task_queue.read_lease(layout.summary_lease, ROLE_TASK).release.reason == "left"
    b.tick()  # a's last round: the summary still advanced
    assert not b.writing
    clock.advance(SILENT_INTERVALS * b.interval_secs)
    b.tick()  # silent now, and the lease released: no TTL to wait
    assert b.writing and read_summary(layout, manifest).seq == "2.1"


def test_the_gate_answers_from_the_summary_without_reading_the_job(tmp_path, clock):
    job, layout, manifest, peers = _job(tmp_path, 40, done=30, held=4)
    keeper = _keeper(layout, manifest, clock)
    for peer, _ in peers:  # fast peers: 1 s per shard, two results each
        pace = PaceWriter(layout, peer)
        pace.finished(1.0, 1)
        pace.finished(1.0, 1)
        pace.flush()
    me = identity("slow", pid=777)
    slow = PaceWriter(layout, me)
    slow.finished(20.0, 1)
    slow.finished(20.0, 1)
    slow.flush()
    keeper.tick()
    reader = SummaryReader(layout, manifest, ttl_secs=TTL, clock=clock, min_interval=0.0)
    register_reader(reader)
    seen_advancing(reader, keeper)
    gate = ClaimGate(layout, manifest, "slow", 777, min_interval=0.0, clock=clock)
    allowed, ops = counted(gate)
    # 4 peers finish ~19 shards each in one of our shard times: the 6 pending shards are theirs
    assert allowed is False
    assert all(path == str(layout.summary_seq) for _, path in ops.trace), ops.trace


def test_workers_keep_the_summary_and_finish_the_job(tmp_path):
    """Three real worker loops (threads, real clock): one writes the summary, all read it; the job
    completes and the last summary agrees with the done markers.  The workers read the brief and the
    sequence, never summary.json (what `status` reads: several times the bytes)."""
    import threading
    from collections import Counter

    job, layout, manifest, _ = _job(tmp_path, 24)
    results, copy = [], copy_runner()
    reads: Counter[str] = Counter()
    fault_seam.set_fault_hook(lambda op, path: reads.update([Path(path).name] if op == "read" else []))

    def slow_copy(task):  # a second or so in all: the keepers get a few rounds in
        time.sleep(0.1)
        return copy(task)

    def work(k):
        results.append(
            run_worker(
                job,
                identity(f"w{k}"),
                slow_copy,
                WorkerSettings(ttl_secs=2.0, heartbeat_secs=0.4, max_retries=1, poll_interval_secs=0.05),
            )
        )

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join(timeout=120)
    finally:
        fault_seam.set_fault_hook(None)
    assert len(results) == 3 and all(r.complete for r in results)
    assert reads["brief.json.z"] >= 1 and reads["summary.seq"] >= reads["brief.json.z"], reads
    assert reads["summary.json"] == 0, reads
    assert sum(r.done for r in results) == 24
    summary = read_summary(layout, manifest)
    assert summary is not None and summary.done_count == 24
    # the summary's node paces are as of its last round (its writer may leave before the others);
    # the pace records themselves count every accepted result once
    assert sum(n.done for n in summary.nodes) <= 24
    paces = [read_pace(layout, p.name) for p in layout.paces_dir.glob("*.json")]
    assert sum(p.done for p in paces) == 24 and all(p.stopped for p in paces)


def test_a_summary_directory_planted_as_a_link_out_of_the_job_is_refused(tmp_path):
    from data_juicer_elastic.errors import JobDirError

    job, layout, manifest, _ = _job(tmp_path, 4)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    layout.summary_dir.symlink_to(outside)
    with pytest.raises(JobDirError, match="leads outside the job directory"):
        run_worker(
            job,
            identity("w"),
            copy_runner(),
            WorkerSettings(ttl_secs=2.0, heartbeat_secs=0.4, max_retries=1, poll_interval_secs=0.05),
        )
    assert list(outside.iterdir()) == []


def test_a_worker_stops_probing_when_the_summary_is_behind(tmp_path, clock, monkeypatch):
    """Shards the summary shows free were claimed since: a worker gives up after a few of them and
    waits for the next summary, instead of every woken worker probing every one."""
    job, layout, manifest, _ = _job(tmp_path, 10, done=2)
    keeper = _keeper(layout, manifest, clock)
    keeper.tick()
    claimer = _claimer(layout, manifest, clock)
    seen_advancing(claimer.summary, keeper)
    late = identity("late", pid=51_000, hostname="host-late", boot_id="boot-late")
    for entry in manifest.shards[2:]:  # claimed after the summary, by a process without a pace record yet
        task_queue.publish_claim(
            layout, task_queue.read_lease(layout, entry.shard_id), late, "l-1", TakeoverReason.FIRST
        )
    probed = []
    original = claimer._probe
    monkeypatch.setattr(claimer, "_probe", lambda entry, vouched=None: probed.append(entry) or original(entry, vouched))
    assert claimer.claim_next() == (None, False)
    assert len(probed) == claiming.MAX_TAKEN_PER_SUMMARY < 8


def test_a_reader_never_goes_back_to_an_older_writers_round(tmp_path, clock):
    """A writer taken over while it was writing may land one late round: readers that read the newer
    generation's keep it."""
    from dataclasses import replace

    from data_juicer_elastic.jobdir.job_summary import brief_of, write_summary

    job, layout, manifest, _ = _job(tmp_path, 4, done=1)
    _keeper(layout, manifest, clock).tick()
    first = read_summary(layout, manifest)
    places = {entry.shard_id: i for i, entry in enumerate(manifest.shards)}

    def write_round(seq: str) -> None:
        write_summary(layout, replace(first, seq=seq), brief_of(first, places))

    reader = SummaryReader(layout, manifest, ttl_secs=TTL, clock=clock, min_interval=0.0)
    reader.view()
    for seq in ("2.1", "2.2"):  # generation 2 took the writer's lease over and wrote two rounds
        write_round(seq)
        reader.view()
    assert reader.view().seq == "2.2"
    write_round("1.3")  # the old writer's late round
    assert reader.view().seq == "2.2"
    write_round("2.3")
    assert reader.view().seq == "2.3"


def test_the_live_line_counts_done_and_failed_shards_from_the_summary_without_a_listing(tmp_path, clock, monkeypatch):
    """The console's job line (console.displays.JobDisplay) in a process whose worker reads the job
    summary: done and failed shards come from it, never from a listing of done/ (at 1,000 nodes,
    100,000 names per node every 2 s); the oracle is the job's done markers."""
    from data_juicer_elastic.console import displays

    job, layout, manifest, _ = _job(tmp_path, 16, done=5)
    fsio.makedirs(layout.failed_dir)
    fsio.write_new(layout.failed(manifest.shards[9].shard_id), b"{}", durable=False)
    keeper = _keeper(layout, manifest, clock)
    keeper.tick()
    reader = SummaryReader(layout, manifest, ttl_secs=TTL, clock=clock, min_interval=0.0)
    register_reader(reader)
    seen_advancing(reader, keeper)
    shard_rows = {e.shard_id: e.rows for e in manifest.shards}
    display = displays.JobDisplay(job, shard_rows, terminal=False, clock=clock)

    def refresh() -> None:  # with listings refused (the display lists with os.listdir)
        def no_listing(path):
            raise AssertionError(f"listed {path}")

        with monkeypatch.context() as patch:
            patch.setattr(displays.os, "listdir", no_listing)
            display.refresh_listing()

    refresh()
    on_disk = {e.shard_id for e in manifest.shards if layout.done(e.shard_id).exists()}
    assert display.done == on_disk and len(on_disk) == 5
    assert display.failed == {manifest.shards[9].shard_id}
    result = ShardResult(manifest.shards[12].shard_id, "other-1", 1, "peer", 1, 1, "0" * 64, "x", 1, "0", 1.0)
    fsio.write_new(layout.done(manifest.shards[12].shard_id), result.encode(), durable=False)
    refresh()
    assert len(display.done) == 5, "the summary's round is not written yet: the line waits for it"
    mine = manifest.shards[13].shard_id  # this process's own attempt: its result shows at once
    claim = task_queue.publish_claim(
        layout, task_queue.read_lease(layout, mine), identity("me", pid=31_000), "m-1", "none"
    )
    tracker = heartbeats.ProgressTracker(layout, claim, 1)
    display.attach(tracker)
    tracker.finish()
    result = ShardResult(mine, "me", 1, "m-1", 1, 1, "0" * 64, "x", 1, "0", 1.0)
    fsio.write_new(layout.done(mine), result.encode(), durable=False)
    refresh()
    assert display.done == on_disk | {mine}, "its own result before the summary's next round"
    keeper.tick()
    refresh()
    assert display.done == on_disk | {manifest.shards[12].shard_id, mine}
    assert display.numbers()["shards_done"] == 7 and display.grace >= 2 * keeper.interval_secs


def test_the_report_shows_an_attempt_claimed_since_the_summary_as_running(tmp_path, clock):
    """`status` reads the live claims from the summary (a claim made since shows pending until the
    next round); the report then reads the shard's lease, so the new attempt is running, not lost."""
    from data_juicer_elastic.jobdir import attempts
    from data_juicer_elastic.jobdir.shard_state import ShardState
    from data_juicer_elastic.status.job_history import AttemptOutcome, read_history
    from data_juicer_elastic.status.job_view import read_view

    job, layout, manifest, _ = _job(tmp_path, 2)
    _keeper(layout, manifest, clock).tick()
    peer = identity("late", pid=51_000, hostname="host-late", boot_id="boot-late")
    shard = manifest.shards[1].shard_id
    claim = task_queue.publish_claim(layout, task_queue.read_lease(layout, shard), peer, "late-1", TakeoverReason.FIRST)
    attempts.open_attempt(layout, claim, peer)
    heartbeats.write_heartbeat(layout, claim, 1)
    status = read_view(job).snapshot
    assert status.from_summary and status.shards[1].state is ShardState.PENDING
    attempt = next(a for a in read_history(job).attempts if a.attempt_id == "late-1")
    assert attempt.outcome is AttemptOutcome.RUNNING and not attempt.stale and attempt.heartbeat_age_secs < 60
