"""How fast is ``dj-elastic status`` on a job of 10,000 shards?

Builds a synthetic job directory with the real jobdir record writers (prepare,
claims, heartbeats, attempts, results, failures, progress, the workers' pace
records and one round of the job summary): a mix of done, running (one of them a
straggler), stale-looking, failed, retried and pending shards on several nodes.
Then times ``dj-elastic status`` and ``dj-elastic status --json`` as subprocesses
twice: read with the job summary (the default) and from the job directory
(``--all``, which reads every done marker), against a baseline measured in the
same run: ``dj-elastic --version`` (interpreter + CLI start, no job read).  It also
counts the metadata operations of one snapshot of each kind (the fault seam).

    python benchmarks/bench_status.py [--shards 10000] [--repeat 3] [--job-dir DIR]

Also used by tests/jobdir/test_status_scale.py (functional assertions only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from data_juicer_elastic.jobdir import attempts, heartbeats, task_queue
from data_juicer_elastic.jobdir.heartbeats import StalenessObserver
from data_juicer_elastic.jobdir.job_summary import PaceWriter, brief_of, write_summary
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest, publish_rows_record
from data_juicer_elastic.jobdir.records import ShardResult
from data_juicer_elastic.jobdir.roles import compose_summary, refresh_paces
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job
from data_juicer_elastic.sharedfs import fault_seam, fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

REPO = Path(__file__).resolve().parents[1]
NODES = 8
MAX_RETRIES = 1
SETTINGS = {"max_retries": MAX_RETRIES, "lease_ttl_secs": 120.0}  # heartbeat every 30 s
# Spread evenly over the claimed part of the job; the rest of the claimed shards are done.
RUNNING = 20  # one per slot of a mid-size cluster; the first one is a straggler (reads nothing)
FAILED = 10  # terminally failed (MAX_RETRIES + 1 failures)
RETRIED = 30  # failed once on one node, then done on another
PENDING_FRACTION = 0.25  # the last quarter has not been claimed yet
ROWS_PER_SHARD = 4


def _identity(node: int) -> WorkerIdentity:
    me = WorkerIdentity.current(f"node-{node:02d}")
    return replace(me, hostname=f"host-{node:02d}", boot_id=f"boot-{node:02d}", pid=10_000 + node)


class _Clock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def _no_fsync() -> Iterator[None]:
    """fsync is what the writers do for crash safety; a synthetic job needs none (same bytes, 3x faster)."""
    real = os.fsync
    os.fsync = lambda fd: None
    try:
        yield
    finally:
        os.fsync = real


def build_job(
    root: Path,
    shards: int = 10_000,
    rows_per_shard: int = ROWS_PER_SHARD,
    pending_fraction: float = PENDING_FRACTION,
    summary: bool = False,
    bare_done: bool = False,
) -> dict[str, list[str]]:
    """Create the synthetic job in ``root``; returns shard ids by intended role.  ``summary``: also
    each node's pace record and one round of the job summary, as the workers would have left them.
    ``bare_done``: a done shard is its done marker alone (no claim, attempt or output: what status
    from the summary never reads; ``--all`` reads the marker), and shards are read in place: a
    100,000-shard job builds in minutes instead of an hour."""
    with _no_fsync():
        roles = _build(root, shards, rows_per_shard, pending_fraction, bare_done)
        if summary:
            _summarize(JobLayout(root), roles)
        return roles


def _summarize(layout: JobLayout, roles: dict[str, list[str]]) -> None:
    """A pace record per node (its accepted results, the claims it holds) and one summary round."""
    manifest = load_manifest(layout.root)
    paces: dict[str, PaceWriter] = {}

    def pace(node: str) -> PaceWriter:
        if node not in paces:
            paces[node] = PaceWriter(layout, _identity(int(node.rsplit("-", 1)[1])))
        return paces[node]

    for shard in roles["done"]:
        result, _ = attempts.read_done(layout, shard)
        pace(result.node_id).finished(20.0, result.rows, result.input_rows)
    for shard in roles["running"]:
        claim = task_queue.read_lease(layout, shard).claim
        pace(claim.node_id).holding(shard, claim.generation, claim.attempt_id)
    for writer in paces.values():
        writer.flush()
    me = _identity(0)
    observer = StalenessObserver(SETTINGS["lease_ttl_secs"], _Clock())
    summary = compose_summary(
        layout, manifest, refresh_paces(layout, {}), observer, me, seq="1.1", writer="bench", interval_secs=5.0
    )
    assert summary.done_count == len(roles["done"]) and len(summary.live) == len(roles["running"])
    write_summary(layout, summary, brief_of(summary, {e.shard_id: i for i, e in enumerate(manifest.shards)}))


def _build(
    root: Path, shards: int, rows_per_shard: int, pending_fraction: float, bare_done: bool = False
) -> dict[str, list[str]]:
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "manifest.json").exists():  # else prepared already (a 100,000-shard prepare takes minutes)
        data = root.parent / f"{root.name}-input.jsonl"
        with open(data, "w", encoding="utf-8") as handle:
            for i in range(shards * rows_per_shard):
                handle.write(json.dumps({"id": i, "text": f"row {i}"}) + "\n")
        prepare_job(
            PrepareRequest(
                job_dir=root,
                dataset_path=data,
                num_shards=shards,
                recipe={"process": [{"demo_mapper": None}]},
                stage_identities=["stage-a"],
                settings=SETTINGS,
                copy_shards=not bare_done,  # the schedule below copies each shard file as its "output"
            )
        )
    layout = JobLayout(root)
    manifest = load_manifest(root)
    roles: dict[str, list[str]] = {"done": [], "running": [], "failed": [], "retried": [], "pending": []}
    pending_from = int(shards * (1 - pending_fraction))

    def spread(count: int, offset: int) -> set[int]:
        return set(range(offset, pending_from, max(1, pending_from // count))[:count])

    failed_ids, running_ids, retried_ids = spread(FAILED, 7), spread(RUNNING, 3), spread(RETRIED, 11)
    for entry in manifest.shards:
        i, shard = entry.index, entry.shard_id
        who = _identity(i % NODES)
        if i >= pending_from:
            roles["pending"].append(shard)
        elif i in failed_ids:
            for _ in range(MAX_RETRIES + 1):
                claim = _claim(layout, shard, who)
                att = attempts.open_attempt(layout, claim, who)
                task_queue.record_failure(
                    layout, claim, shard_id=shard, generation=claim.generation, error="ValueError: poison row",
                    error_type="ShardExecutionError", exit_reason="error", max_retries=MAX_RETRIES, reporter=who,
                )  # fmt: skip
                attempts.close_attempt(att, "failed", error="ValueError: poison row")
                task_queue.release_claim(layout, claim, "failed")
            roles["failed"].append(shard)
        elif i in running_ids:
            claim = _claim(layout, shard, who)
            attempts.open_attempt(layout, claim, who)
            heartbeats.write_heartbeat(layout, claim, 5)
            slow = not roles["running"]  # the first one: a straggler that has read nothing in 100 s
            _progress(layout, claim, entry.rows, elapsed=100.0, read=0 if slow else entry.rows, finish=False)
            roles["running"].append(shard)
        elif bare_done and i not in retried_ids:
            _bare_done(layout, entry, who)
            roles["done"].append(shard)
        else:
            if i in retried_ids:
                claim = _claim(layout, shard, who)
                attempts.open_attempt(layout, claim, who)
                task_queue.record_failure(
                    layout, claim, shard_id=shard, generation=claim.generation, error="RayTaskError: worker died",
                    error_type="ShardExecutionError", exit_reason="error", max_retries=MAX_RETRIES, reporter=who,
                )  # fmt: skip
                task_queue.release_claim(layout, claim, "failed")
                who = _identity((i + 1) % NODES)
                roles["retried"].append(shard)
            claim = _claim(layout, shard, who)
            att = attempts.open_attempt(layout, claim, who)
            heartbeats.write_heartbeat(layout, claim, 1)
            output = att.dir / "output.jsonl"
            output.write_bytes(_rows_of(entry) if bare_done else layout.shard(shard).read_bytes())
            attempts.publish_done(layout, claim, output, input_rows=entry.rows, input_sha256=entry.sha256)
            _progress(layout, claim, entry.rows, elapsed=20.0 + i % 7, read=entry.rows, finish=True)
            attempts.close_attempt(att, "done", rows=entry.rows)
            task_queue.release_claim(layout, claim, "finished")
            roles["done"].append(shard)
    return roles


def _rows_of(entry) -> bytes:
    """The shard's rows as the builder wrote them (a job whose shards are read in place has no shard file)."""
    rows = range(entry.first_row, entry.first_row + entry.rows)
    return "".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in rows).encode()


def _bare_done(layout: JobLayout, entry, who: WorkerIdentity) -> None:
    """A done marker as a generation-1 attempt of ``who`` publishes it, and nothing else."""
    result = ShardResult(
        entry.shard_id, who.new_attempt_id(), 1, who.node_id, entry.rows, 0, entry.sha256, "none", entry.rows,
        entry.sha256, time.time(),
    )  # fmt: skip
    fsio.write_new(layout.done(entry.shard_id), result.encode(), durable=False)


def _claim(layout: JobLayout, shard: str, who: WorkerIdentity):
    view = task_queue.read_lease(layout, shard)
    claim = task_queue.publish_claim(layout, view, who, who.new_attempt_id(), "none")
    assert claim is not None
    return claim


def _progress(layout, claim, rows_total: int, *, elapsed: float, read: int, finish: bool) -> None:
    clock = _Clock()
    tracker = heartbeats.ProgressTracker(layout, claim, rows_total, clock=clock)
    tracker.start_writing()  # the caller opened the attempt
    tracker.set_stage(heartbeats.Stage.PROCESSING, "MapBatches(process_batched)")
    for k in range(1, 5):
        clock.now = elapsed * k / 4
        tracker.update(rows_read=read * k // 4, rows_written=read * k // 4, source="ray-data")
        tracker.flush()
    if finish:
        tracker.finish()


def _time(cmd: list[str], repeat: int, checkout: Path = REPO) -> tuple[float, int, str]:
    """Median wall seconds of ``cmd`` run with ``checkout``'s package first on the path (from a
    neutral directory: ``python -m`` would put the current directory first)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    times, proc = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), proc.returncode, proc.stdout


def count_ops(job: Path, *, use_summary: bool) -> int:
    """Metadata operations of one status snapshot (every thread's), through the fault seam."""
    from data_juicer_elastic.status.job_status import snapshot

    ops = []
    fault_seam.set_fault_hook(lambda op, path: ops.append(op))
    try:
        snapshot(job, exact=False, use_summary=use_summary)
    finally:
        fault_seam.set_fault_hook(None)
    return len(ops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--job-dir", help="build here (default: a temporary directory)")
    parser.add_argument("--compare", metavar="CHECKOUT", help="also time `status` of another checkout (e.g. main)")
    parser.add_argument("--bare-done", action="store_true", help="done shards as bare markers (fast to build)")
    parser.add_argument("--skip-all", action="store_true", help="time only the default status (not --all)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-status-") as tmp:
        job = Path(args.job_dir or Path(tmp) / "job")
        t0 = time.perf_counter()
        if not (job / "summary" / "summary.json").exists():  # built before: reused (a prepared job is built on)
            build_job(job, args.shards, summary=True, bare_done=args.bare_done)
        if not (job / "manifest-rows.json").exists():  # prepared before the record existed: as prepare writes it
            publish_rows_record(JobLayout(job))
        print(f"synthetic job: {args.shards} shards built in {time.perf_counter() - t0:.1f}s at {job}")
        print(f"load average: {os.getloadavg()[0]:.2f}")
        exe = [sys.executable, "-m", "data_juicer_elastic.cli"]
        status = [*exe, "status", "--job-dir", str(job)]
        base, _, _ = _time([*exe, "--version"], args.repeat)
        timed = {
            "`dj-elastic status`": _time(status, args.repeat),
            "`dj-elastic status --json`": _time([*status, "--json"], args.repeat),
        }
        if not args.skip_all:
            timed["`dj-elastic status --all`"] = _time([*status, "--all"], args.repeat)
            timed["`dj-elastic status --json --all`"] = _time([*status, "--json", "--all"], args.repeat)
        if args.compare:
            other = Path(args.compare)
            timed[f"`dj-elastic status` of {other}"] = _time(status, args.repeat, other)
            timed[f"`dj-elastic status --json` of {other}"] = _time([*status, "--json"], args.repeat, other)
        for name, (_, _, out) in timed.items():
            if "--json" in name:
                data = json.loads(out) if out.strip() else {}
                print(f"counts: {data.get('counts')} (source: {data.get('source')}) from {name}")
        ops = count_ops(job, use_summary=True)
        walk_ops = "-" if args.skip_all else count_ops(job, use_summary=False)
        print(f"metadata operations of one snapshot: {ops} from the summary, {walk_ops} from the job directory")
        print(f"baseline `dj-elastic --version`: {base:.3f}s")
        for name, (secs, rc, _) in timed.items():
            print(f"{name + ':':<36} {secs:.3f}s (exit {rc}), {secs / base:.2f}x baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
