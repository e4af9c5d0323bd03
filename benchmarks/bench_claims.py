"""Claims: 8 worker processes, 2,000 trivially small shards, the claim path before vs after.

Each variant prepares its own job (one row per shard) and starts N worker processes
(`run_worker` with the straggler gate built as the executor builds it, a trivial copy
processor, no Ray).  The workers import the variant's code: "after" is this checkout,
"before" is ``--baseline-rev`` (default: the commit before the claim cursor) exported
with ``git archive``.  Every worker waits for a start signal, so interpreter start and
imports are not timed, then counts every metadata operation through ``fsio``'s hook
(the scale model's unit: one fsio call, ``makedirs`` = 3, data writes not counted),
separately for the claim path (inside ``claim_next``, gate included), the gate alone, and
in total, plus the directory listings of ``done/`` and ``claims/`` and the names they return
(a listing is one operation but O(shards) names).

  claims/s      = accepted claims of all workers / (last worker exit - start signal)
  ops per claim = metadata operations / claims (claim path, and everything)

    python benchmarks/bench_claims.py --workdir /tmp/dje-claims
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE_REV = "7c1c9c6"  # main before the claim cursor
WEIGHT = {"makedirs": 3, "write": 0}


# -- one worker process (run with --worker) --------------------------------------------------------------
def worker(job: Path, k: int, go: Path, out: Path, poll: float, gate_on: bool) -> None:
    from loguru import logger

    from data_juicer_elastic.coordination.stragglers import ClaimGate
    from data_juicer_elastic.jobdir import shard_attempt, worker_loop
    from data_juicer_elastic.jobdir.layout import JobLayout
    from data_juicer_elastic.jobdir.manifest import load_manifest
    from data_juicer_elastic.jobdir.tasks import ShardOutput
    from data_juicer_elastic.rows.shard_source import iter_source_lines
    from data_juicer_elastic.sharedfs import fault_seam
    from data_juicer_elastic.sharedfs.identity import WorkerIdentity

    try:
        from data_juicer_elastic.jobdir.worker_settings import WorkerSettings as settings_type
    except ImportError:
        settings_type = None
    logger.remove()
    counts = {"claim": 0, "gate": 0, "total": 0, "claims": 0, "calls": 0, "listings": 0, "listed": 0}
    inside, in_gate = [False], [False]

    def hook(op: str, path: Path) -> None:
        weight = WEIGHT.get(op, 1)
        counts["total"] += weight
        if inside[0]:
            counts["claim"] += weight
        if in_gate[0]:
            counts["gate"] += weight
        if op == "listdir" and Path(path).name in ("done", "claims"):
            counts["listings"] += 1
            counts["listed"] += len(os.listdir(path)) if os.path.isdir(path) else 0

    original_gate = ClaimGate.__call__

    def gate_call(self):
        in_gate[0] = True
        try:
            return original_gate(self)
        finally:
            in_gate[0] = False

    ClaimGate.__call__ = gate_call

    original = shard_attempt.ShardWorker.claim_next

    def claim_next(self):
        inside[0] = True
        try:
            got, finished = original(self)
        finally:
            inside[0] = False
        counts["calls"] += 1
        counts["claims"] += got is not None
        return got, finished

    shard_attempt.ShardWorker.claim_next = claim_next

    def run(task):
        data = b"".join(line + b"\n" for line in iter_source_lines(task.source))
        task.output_path.write_bytes(data)
        return ShardOutput(task.output_path, data.count(b"\n"))

    identity = WorkerIdentity.current(node_id=f"bench-{k}")
    layout, manifest = JobLayout(job), load_manifest(job)
    gate = ClaimGate(layout, manifest, identity.node_id, identity.pid, min_interval=poll) if gate_on else None
    while not go.exists():
        time.sleep(0.005)
    fault_seam.set_fault_hook(hook)
    started = time.time()
    values = dict(ttl_secs=60.0, heartbeat_secs=10.0, max_retries=2, poll_interval_secs=poll)
    if settings_type is None:  # a baseline revision whose run_worker takes these as keywords
        summary = worker_loop.run_worker(job, identity, run, claim_gate=gate, **values)
    else:
        summary = worker_loop.run_worker(job, identity, run, settings_type(**values), claim_gate=gate)
    fault_seam.set_fault_hook(None)
    counts.update(started=started, ended=time.time(), done=summary.done, complete=summary.complete)
    out.write_text(json.dumps(counts))


# -- the driver ---------------------------------------------------------------------------------------
def export_baseline(rev: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "data_juicer_elastic"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run_variant(name: str, src: Path, args: argparse.Namespace) -> dict:
    base = args.workdir / name
    data = base / "input.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(args.shards)))
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{REPO}"}
    prepare = (
        "import sys; from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job;"
        "prepare_job(PrepareRequest(job_dir=sys.argv[1], dataset_path=sys.argv[2], num_shards=int(sys.argv[3]),"
        "recipe={'process': []}, stage_identities=['bench']))"
    )
    subprocess.run([sys.executable, "-c", prepare, base / "job", data, str(args.shards)], env=env, check=True)
    go = base / "go"
    procs = []
    for k in range(args.workers):
        argv = [sys.executable, __file__, "--worker", str(k), "--job", str(base / "job"), "--go", str(go)]
        argv += ["--out", str(base / f"w{k}.json"), "--poll", str(args.poll)] + (["--no-gate"] if args.no_gate else [])
        procs.append(subprocess.Popen(argv, env=env))
    time.sleep(args.settle)  # let every worker import and reach the start line
    t0 = time.time()
    go.touch()
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"{name}: a worker exited with {p.returncode}")
    stats = [json.loads((base / f"w{k}.json").read_text()) for k in range(args.workers)]
    wall = max(s["ended"] for s in stats) - t0
    claims = sum(s["claims"] for s in stats)
    done = len(list((base / "job" / "done").iterdir()))
    assert done == args.shards and sum(s["done"] for s in stats) == args.shards, (done, stats)
    return {
        "variant": name,
        "wall_s": round(wall, 2),
        "claims": claims,
        "claims_per_s": round(claims / wall, 1),
        "claim_path_ops_per_claim": round(sum(s["claim"] for s in stats) / claims, 1),
        "of_which_gate": round(sum(s["gate"] for s in stats) / claims, 1),
        "listings_per_claim": round(sum(s["listings"] for s in stats) / claims, 2),
        "names_listed_per_claim": round(sum(s["listed"] for s in stats) / claims, 1),
        "all_ops_per_claim": round(sum(s["total"] for s in stats) / claims, 1),
        "claim_next_calls": sum(s["calls"] for s in stats),
        "shards_by_worker": sorted((s["done"] for s in stats), reverse=True),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dje-claims"))
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--shards", type=int, default=2000)
    ap.add_argument("--poll", type=float, default=0.05, help="poll interval (also the gate's min interval)")
    ap.add_argument("--no-gate", action="store_true", help="straggler gate off (strict mode)")
    ap.add_argument("--baseline-rev", default=BASELINE_REV, help="git revision of the 'before' code; '' to skip")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds for workers to import before the start")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--go", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.job, args.worker, args.go, args.out, args.poll, not args.no_gate)
        return
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    if args.baseline_rev:
        rows.append(run_variant("before", export_baseline(args.baseline_rev, args.workdir / "baseline-src"), args))
        print(json.dumps(rows[-1]), flush=True)
    rows.append(run_variant("after", REPO, args))
    print(json.dumps(rows[-1]), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if len(rows) == 2:
        b, a = rows
        print(
            f"after/before: claims/s x{a['claims_per_s'] / b['claims_per_s']:.2f}, claim-path ops per claim "
            f"x{a['claim_path_ops_per_claim'] / b['claim_path_ops_per_claim']:.3f}, "
            f"all ops per claim x{a['all_ops_per_claim'] / b['all_ops_per_claim']:.3f}"
        )


if __name__ == "__main__":
    main()
