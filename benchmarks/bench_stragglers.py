"""Stragglers: 4 instances of one `dj-process` command, two of them slowed 2x and 4x.

Every instance is a real `dj-process` with its own node id and warm local Ray runtime
(1 CPU each), sharing one run id, as a scheduler's broadcast starts them.  The work is
a per-row sleep (an accelerator- or I/O-bound operator; it keeps 4 runtimes on a small
machine from measuring CPU contention instead of scheduling), multiplied by 2 and 4 on
the two slow nodes.  With num_shards = 4 x workers, dynamic claiming should let the
fast nodes take most shards:

  fast shard   = median duration of a fast node's warm attempts (each node's first attempt
                 is cold: it includes that node's Ray start and first Ray worker spawns)
  total work   = fast shard x num_shards
  speed_i      = fast shard / node i's mean warm attempt (nominal 1/slowdown when a node
                 ran a single shard); measured, so unslowed per-shard overhead counts
  cold start   = mean over nodes of (first attempt - the node's warm shard time): paid
                 once by every node at the same time, not work a scheduler can move
  ideal        = total work / sum(speed_i) + cold start
  makespan     = first attempt start -> last attempt end (the work phase); the whole
                 command (interpreter start, elected prepare and finalize) is reported too

    python benchmarks/bench_stragglers.py --workdir /tmp/dje-stragglers
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "demos"))
from generate_data import write_dataset  # noqa: E402

NODES = {"fast-1": 1.0, "fast-2": 1.0, "slow-2x": 2.0, "slow-4x": 4.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-stragglers"))
    parser.add_argument("--rows-per-shard", type=int, default=100)
    parser.add_argument("--seconds-per-row", type=float, default=0.1)
    parser.add_argument("--shards-per-worker", type=int, default=4)
    parser.add_argument("--analyze-only", action="store_true", help="recompute the figures of an earlier run")
    args = parser.parse_args()
    num_shards = args.shards_per_worker * len(NODES)
    if args.analyze_only:
        print(json.dumps(analyze(args.workdir / "job", num_shards), indent=2))
        return

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    num_shards = args.shards_per_worker * len(NODES)
    data = write_dataset(args.workdir / "input.jsonl", rows=num_shards * args.rows_per_shard, seed=3)
    job = args.workdir / "job"
    recipe = args.workdir / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "project_name": "bench-stragglers",
                "executor_type": "elastic_sharded",
                "dataset_path": str(data),
                "export_path": str(args.workdir / "merged.jsonl"),
                "np": 1,
                "custom_operator_paths": [str(REPO / "benchmarks" / "ops" / "straggler_ops.py")],
                "elastic": {
                    "job_dir": str(job),
                    "num_shards": num_shards,
                    "ray_num_cpus": 1,
                    "poll_interval_secs": 0.5,
                },
                "process": [
                    {"straggler_sleep_mapper": {"seconds_per_row": args.seconds_per_row, "slowdown": NODES}},
                    {"whitespace_normalization_mapper": None},
                ],
            },
            sort_keys=False,
        )
    )
    run_id = f"stragglers-{os.getpid()}"
    t0 = time.time()
    procs = {}
    for node in NODES:
        env = {**os.environ, "DJ_ELASTIC_NODE_ID": node, "DJ_ELASTIC_RUN_ID": run_id}
        log = open(args.workdir / f"{node}.log", "w")
        procs[node] = subprocess.Popen(["dj-process", "--config", str(recipe)], env=env, stdout=log, stderr=log)
    codes = {node: p.wait() for node, p in procs.items()}
    wall = time.time() - t0
    if any(codes.values()):
        raise SystemExit(f"an instance failed: {codes}; see {args.workdir}/*.log")

    result = analyze(job, num_shards)
    result["command_wall_s"] = round(wall, 2)
    print(json.dumps(result, indent=2))
    print(f"work-phase makespan / ideal = {result['makespan_over_ideal']:.3f}  (target <= 1.15)")
    (args.workdir / "results.json").write_text(json.dumps(result, indent=2))


def analyze(job: Path, num_shards: int) -> dict:
    records = [json.loads(p.read_text()) for p in job.glob("attempts/*/*/attempt.json")]
    by_node: dict[str, list[float]] = {node: [] for node in NODES}
    for rec in sorted(records, key=lambda r: r["started_at"]):
        by_node[rec["node_id"]].append(rec["ended_at"] - rec["started_at"])
    warm = {node: ds[1:] for node, ds in by_node.items()}
    fast = statistics.median(d for node, ds in warm.items() if NODES[node] == 1.0 for d in ds)
    speeds = {node: (fast / statistics.mean(ds) if ds else 1.0 / NODES[node]) for node, ds in warm.items()}
    cold = statistics.mean(ds[0] - fast / speeds[node] for node, ds in by_node.items() if ds)
    total_work = fast * num_shards
    ideal = total_work / sum(speeds.values()) + cold
    span = max(r["ended_at"] for r in records) - min(r["started_at"] for r in records)
    return {
        "num_shards": num_shards,
        "attempts": len(records),
        "shards_by_node": {node: len(ds) for node, ds in by_node.items()},
        "first_attempt_s_by_node": {node: round(ds[0], 2) for node, ds in by_node.items() if ds},
        "warm_attempt_s_by_node": {node: round(statistics.mean(ds), 2) if ds else None for node, ds in warm.items()},
        "speed_by_node": {node: round(s, 3) for node, s in speeds.items()},
        "fast_shard_s": round(fast, 2),
        "cold_start_s": round(cold, 2),
        "ideal_s": round(ideal, 2),
        "work_phase_makespan_s": round(span, 2),
        "makespan_over_ideal": round(span / ideal, 3),
        "makespan_over_ideal_without_cold_start": round((span - cold) / (ideal - cold), 3),
    }


if __name__ == "__main__":
    main()
