"""A Hypothesis state machine over the whole protocol: workers claim, heartbeat, pause, crash,
restart with no memory, are preempted, take over on their own skewed clocks, publish (also as
zombies), fail, are retried, find torn lease files, and merge.  Invariants: one winner per
claim generation, at most one live claim per shard, DONE is terminal with exactly one accepted
result (on disk: the done marker is a link of exactly one attempt's result.json), a failed
shard spent its budget, merge order == manifest order (also in merge.json), and status agrees."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import attempts, heartbeats, task_queue
from data_juicer_elastic.jobdir.attempts import ShardOutput, ShardTask
from data_juicer_elastic.jobdir.exports import MergeRecord
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import TakeoverReason
from data_juicer_elastic.jobdir.retry import retry_shards
from data_juicer_elastic.jobdir.shard_state import ShardState
from data_juicer_elastic.jobdir.worker import WorkerSettings, keeper_in_loop, run_worker
from data_juicer_elastic.rows.shard_source import iter_source_lines
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.status.job_status import snapshot

from .conftest import FakeClock, identity, make_rows, request, write_rows

TTL, HEARTBEAT, MAX_RETRIES, SHARDS, WORKERS, ROWS = 30.0, 5.0, 1, 3, 3, 9


class Protocol(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        # tmpfs where there is one: the protocol does not depend on durability, and fsync was
        # most of the run time on disk.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.tmp = Path(tempfile.mkdtemp(prefix="dj-sm-", dir=shm))
        data = write_rows(self.tmp / "in.jsonl", make_rows(ROWS))
        prepare_job(request(self.tmp / "job", data, SHARDS, copy_shards=True))
        self.layout = JobLayout(self.tmp / "job")
        self.manifest = load_manifest(self.layout.root)
        self.clock = FakeClock(0)
        # Distinct boot ids: only the observer rule may declare a holder stale.  Each
        # worker's clock is skewed by a large offset: only differences may matter.
        self.workers = [identity(f"w{i}", boot_id=f"boot-{i}") for i in range(WORKERS)]
        self.offsets = [0.0, 1e6, -3e5]
        self.observers = [self._observer(w) for w in range(WORKERS)]
        self.paused: set[int] = set()
        self.held: dict[tuple[int, str], heartbeats.Heartbeater] = {}  # what each worker believes it holds
        self.won: set[tuple[str, int]] = set()
        self.accepted: dict[str, str] = {}  # shard -> attempt id whose result was accepted
        self.done_bytes: dict[str, bytes] = {}

    def _observer(self, w: int) -> task_queue.StalenessObserver:
        return task_queue.StalenessObserver(TTL, lambda off=self.offsets[w]: self.clock() + off)

    def teardown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- rules -----------------------------------------------------------------------------------
    @initialize()
    def every_worker_starts_with_a_claim(self):
        for w in range(WORKERS):
            self.claim(w)

    @rule(w=st.integers(0, WORKERS - 1))
    def claim(self, w):
        """Like the worker loop: the first claimable shard in manifest order."""
        if w in self.paused:
            return
        for shard in self.manifest.shard_ids:
            if self._try_claim(w, shard):
                return

    def _try_claim(self, w: int, shard: str) -> bool:
        if fsio.exists(self.layout.done(shard)) or fsio.exists(self.layout.failed(shard)):
            return False
        if task_queue.publish_terminal_if_exhausted(self.layout, shard, MAX_RETRIES):
            return False
        view = task_queue.read_lease(self.layout, shard)
        reason = task_queue.takeover_reason(view, self.workers[w], self.observers[w])
        if reason is None:
            return False
        if reason == TakeoverReason.STALE:
            outcome = task_queue.record_failure(
                self.layout, view.claim, shard_id=shard, generation=view.generation, error="stale",
                error_type="LeaseExpired", exit_reason="lease-expired", max_retries=MAX_RETRIES,
                reporter=self.workers[w],
            )  # fmt: skip
            if outcome.terminal:
                return False
        claim = task_queue.publish_claim(self.layout, view, self.workers[w], self.workers[w].new_attempt_id(), reason)
        if claim is None:
            return False
        event(f"claim: {reason}")
        assert (shard, claim.generation) not in self.won, "two winners for one generation"
        self.won.add((shard, claim.generation))
        attempts.open_attempt(self.layout, claim, self.workers[w])
        hb = heartbeats.Heartbeater(self.layout, claim, heartbeat_secs=HEARTBEAT, ttl_secs=TTL, clock=self.clock)
        hb.beat()
        self.held[(w, shard)] = hb
        return True

    def _idle_scan(self) -> None:
        """Running workers keep looking at every shard (feeding their observers)."""
        for w in range(WORKERS):
            if w not in self.paused:
                for shard in self.manifest.shard_ids:
                    view = task_queue.read_lease(self.layout, shard)
                    task_queue.takeover_reason(view, self.workers[w], self.observers[w])

    @rule(dt=st.sampled_from([HEARTBEAT, TTL]))
    def time_passes(self, dt):
        """Running workers scan and renew their heartbeats as time passes; paused ones do neither."""
        self._idle_scan()
        self.clock.advance(dt)
        for (w, _), hb in self.held.items():
            if w not in self.paused:
                hb.beat()

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def stall_past_ttl(self, data):
        """A holder is SIGSTOPped while the others run on for more than a TTL (zombie in the making)."""
        w = data.draw(st.sampled_from(sorted({k[0] for k in self.held})))
        self.pause(w)
        self.time_passes(TTL)
        self.time_passes(TTL)
        for other in range(WORKERS):
            if other != w:
                self.claim(other)

    @rule(w=st.integers(0, WORKERS - 1))
    def pause(self, w):
        """SIGSTOP: no heartbeats until the worker acts again (then it is a zombie)."""
        self.paused.add(w)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), skip_fence=st.booleans())
    def finish(self, data, skip_fence):
        """Publish.  ``skip_fence``: the worker passed the advisory check just before a pause."""
        self._finish(data.draw(st.sampled_from(sorted(self.held))), skip_fence)

    def _zombies(self) -> list[tuple[int, str]]:
        return sorted(k for k, hb in self.held.items() if heartbeats.newer_generation_exists(self.layout, hb.claim))

    @precondition(lambda self: self._zombies())
    @rule(data=st.data(), skip_fence=st.booleans())
    def zombie_wakes(self, data, skip_fence):
        """A holder whose shard was taken over (paused past TTL, torn claim) tries to publish."""
        event("zombie wakes")
        self._finish(data.draw(st.sampled_from(self._zombies())), skip_fence)

    def _finish(self, key: tuple[int, str], skip_fence: bool) -> None:
        hb = self.held.pop(key)
        self.paused.discard(key[0])
        claim = hb.claim
        if not skip_fence and (not hb.check() or heartbeats.newer_generation_exists(self.layout, claim)):
            event("abandoned (fenced)")
            task_queue.release_claim(self.layout, claim, "abandoned")
            return
        directory = self.layout.attempt_dir(claim.shard_id, claim.attempt_id)
        entry = self.manifest.shard(claim.shard_id)
        rows = [json.loads(line) for line in self.layout.shard(claim.shard_id).read_text().splitlines()]
        out = directory / "output.jsonl"
        out.write_text("".join(json.dumps({**r, "by": claim.attempt_id}) + "\n" for r in rows))
        outcome = attempts.publish_done(
            self.layout, claim, out, input_rows=entry.rows, input_sha256=entry.sha256, declared_rows=len(rows)
        )
        event(f"publish: {'accepted' if outcome.accepted else 'discarded'}")
        if outcome.accepted:
            assert claim.shard_id not in self.accepted, "a second result was accepted"
            self.accepted[claim.shard_id] = claim.attempt_id
        task_queue.release_claim(self.layout, claim, "finished")

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def fail(self, data):
        key = data.draw(st.sampled_from(sorted(self.held)))
        claim = self.held.pop(key).claim
        self.paused.discard(key[0])
        task_queue.record_failure(
            self.layout, claim, shard_id=claim.shard_id, generation=claim.generation, error="boom",
            error_type="ValueError", exit_reason="error", max_retries=MAX_RETRIES, reporter=self.workers[key[0]],
        )  # fmt: skip
        task_queue.release_claim(self.layout, claim, "failed")

    @precondition(lambda self: self.held)
    @rule(data=st.data(), release=st.booleans())
    def crash_or_preempt(self, data, release):
        """kill -9 (no record: the claim goes stale) or SIGTERM (release) of a holding worker."""
        w = data.draw(st.sampled_from(sorted({k[0] for k in self.held})))
        for key in [k for k in self.held if k[0] == w]:
            claim = self.held.pop(key).claim
            if release:
                task_queue.release_claim(self.layout, claim, "signal")
        self.paused.discard(w)

    @rule()
    def drain(self):
        """The real worker loop (a fresh worker, its sleeps move the fake clock) runs the job to
        its end while the modelled workers are frozen: their claims go stale and are taken over."""
        event("drain")
        drainer = identity("drain", boot_id="boot-drain")

        def run(task: ShardTask) -> ShardOutput:
            rows = [json.loads(line) for line in iter_source_lines(task.source)]
            task.output_path.write_text("".join(json.dumps({**r, "by": task.attempt_id}) + "\n" for r in rows))
            return ShardOutput(task.output_path, len(rows))

        summary = run_worker(
            self.layout.root,
            drainer,
            run,
            WorkerSettings(
                ttl_secs=TTL, heartbeat_secs=HEARTBEAT, max_retries=MAX_RETRIES, poll_interval_secs=HEARTBEAT
            ),
            clock=self.clock,
            drive_keeper=keeper_in_loop,
            sleep=self.clock.advance,
        )
        assert summary.stop_reason == "finished"
        for shard in self.manifest.shard_ids:
            result, error = attempts.read_done(self.layout, shard)
            assert error is None
            if result is not None and shard not in self.accepted:
                assert result.node_id == "drain"
                self.accepted[shard] = result.attempt_id
            assert result is not None or task_queue.read_terminal(self.layout, shard)[0] is not None
        self.merge()

    @rule(w=st.integers(0, WORKERS - 1))
    def restart(self, w):
        """kill -9 and start again: the new process remembers nothing it observed."""
        for key in [k for k in self.held if k[0] == w]:
            del self.held[key]
        self.paused.discard(w)
        self.observers[w] = self._observer(w)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def renew(self, data):
        """A holder's heartbeat thread renews between two steps of the others."""
        key = data.draw(st.sampled_from(sorted(self.held)))
        if key[0] not in self.paused:
            self.held[key].beat()

    @rule(data=st.data(), kind=st.sampled_from(["heartbeat", "claim"]))
    def tear(self, data, kind):
        """A torn or flipped lease file (crash mid-write on a filesystem without atomic rename):
        it must read as corrupt, never as a live claim or a fresh heartbeat."""
        shard = data.draw(st.sampled_from(self.manifest.shard_ids))
        generation = task_queue.latest_generation(self.layout, shard)
        if generation == 0:
            return
        path = (self.layout.heartbeat if kind == "heartbeat" else self.layout.claim)(shard, generation)
        if path.exists():
            event(f"torn {kind}")
            data_ = path.read_bytes()
            path.unlink()  # a claim is a hard link of a temp file: never write through it
            path.write_bytes(data_[: len(data_) // 2])
            view = task_queue.read_lease(self.layout, shard)
            assert (view.claim if kind == "claim" else view.heartbeat) is None

    def _failed(self) -> list[str]:
        return [
            s
            for s in self.manifest.shard_ids
            if fsio.exists(self.layout.failed(s)) and not fsio.exists(self.layout.done(s))
        ]

    @precondition(lambda self: self._failed())
    @rule(data=st.data())
    def retry(self, data):
        shard = data.draw(st.sampled_from(self._failed()))
        event("retry")
        assert retry_shards(self.layout.root, [shard]) == [shard]
        assert not task_queue.list_failures(self.layout, shard)

    @rule()
    def merge(self):
        if not all(fsio.exists(self.layout.done(sid)) for sid in self.manifest.shard_ids):
            try:
                merge_job(self.layout.root, self.tmp / "refused.jsonl")
            except JobDirError as exc:
                assert "job is not complete" in exc.message
            else:
                raise AssertionError("an incomplete job was merged")
            assert not (self.tmp / "refused.jsonl").exists()
            return
        event("merge")
        out = self.tmp / "merged.jsonl"
        result = merge_job(self.layout.root, out, overwrite=True)
        lines = out.read_bytes().splitlines()
        assert [json.loads(line)["id"] for line in lines] == list(range(ROWS)), "merge order == manifest order"
        by = [json.loads(line)["by"] for line in lines]
        assert by == [self.accepted[e.shard_id] for e in self.manifest.shards for _ in range(e.rows)]
        assert result.rows == ROWS
        record = MergeRecord.parse(self.layout.merge_record.read_bytes(), self.layout.merge_record)
        assert [(m.shard_id, m.attempt_id) for m in record.shards] == [
            (sid, self.accepted[sid]) for sid in self.manifest.shard_ids
        ], "merge.json lists the accepted attempts in manifest order"
        snap = snapshot(self.layout.root, ttl_secs=TTL)
        assert snap.complete and all(s.state is ShardState.DONE for s in snap.shards)

    # -- invariants -------------------------------------------------------------------------------
    @invariant()
    def at_most_one_live_claim_per_shard(self):
        for shard in self.manifest.shard_ids:
            view = task_queue.read_lease(self.layout, shard)
            # Live: the latest generation and not ended (a zombie's generation may have been
            # ended for it by a taker's failure record: then nobody holds the shard).
            live = [
                hb
                for (_, sid), hb in self.held.items()
                if sid == shard and hb.claim.generation == view.generation and not view.ended
            ]
            assert len(live) <= 1
            for (_, sid), hb in self.held.items():
                if sid == shard and hb.claim.generation < view.generation:
                    assert heartbeats.newer_generation_exists(self.layout, hb.claim), "an older holder is fenced"
            names = [n for n in fsio.list_names(self.layout.claim_dir(shard)) if not n.startswith(".")]
            assert names == [f"gen-{g:06d}.json" for g in range(1, len(names) + 1)], "claims are never removed"

    @invariant()
    def done_is_terminal_with_one_accepted_result(self):
        for shard in self.manifest.shard_ids:
            path = self.layout.done(shard)
            if shard in self.done_bytes:
                assert path.read_bytes() == self.done_bytes[shard], "accepted result changed"
            elif path.exists():
                self.done_bytes[shard] = path.read_bytes()
            if path.exists():
                result, error = attempts.read_done(self.layout, shard)
                assert error is None and result.attempt_id == self.accepted[shard]
            else:
                assert shard not in self.accepted

    @invariant()
    def done_marker_is_a_link_of_exactly_one_attempts_result(self):
        """On disk, independent of the model: link() made done/<shard>.json the very inode of
        the winning attempt's result.json, and of no other attempt's."""
        for shard in self.manifest.shard_ids:
            done = self.layout.done(shard)
            if not done.exists():
                continue
            inode = os.stat(done).st_ino
            sharing = [
                a.name
                for a in self.layout.attempt_root(shard).iterdir()
                if (a / "result.json").exists() and os.stat(a / "result.json").st_ino == inode
            ]
            assert sharing == [self.accepted[shard]], f"{shard}: done marker shared by {sharing}"

    @invariant()
    def failed_only_when_budget_spent(self):
        for shard in self.manifest.shard_ids:
            terminal, _ = task_queue.read_terminal(self.layout, shard)
            if terminal is not None:
                assert terminal.failures >= MAX_RETRIES + 1


Protocol.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestProtocol = Protocol.TestCase
