"""Warm operators across shards: model loads, operator busy fraction, boundary gaps.

One ``dj-elastic worker`` (one slot, one warm Ray runtime) runs an 8-shard job whose only
operator is ``bench_heavy_load_mapper`` (``benchmarks/ops/warm_ops.py``): its ``__init__``
sleeps ``--load-secs`` (a model load) and each batch sleeps ``--batch-secs`` (the accelerator's
work).  The operator runs with ``num_proc: 1``: one batch at a time, like one GPU.  Two
variants: ``task`` (Data-Juicer's default on CPU) and ``actor`` (``ray_execution_mode: actor``,
what ``accelerator: cuda`` selects on a GPU node).  Every load and every batch is recorded
(process id, start, end, first row id); from that record:

* loads per process: the worker process (driver: ``load_ops``) and each Ray worker/actor;
* busy fraction: time inside batches / (last batch end - first batch start), and the same
  over the worker's whole wall time (Ray start and the first load included);
* the idle gap at each shard boundary: first batch of shard k+1 starts - last batch of
  shard k ends.

The merged output is checked against the input (the operator passes rows through).
``--text-bytes`` pads every row (bigger shards: more to hash and parse at a boundary, which
claim-ahead moves off it, ``elastic.claim_ahead``).

    python benchmarks/bench_warm_ops.py --workdir /tmp/dje-warm            # both modes
    python benchmarks/bench_warm_ops.py --mode actor --src /path/to/other/checkout
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
OPS = REPO / "benchmarks" / "ops" / "warm_ops.py"


def write_input(path: Path, rows: int, text_bytes: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows):
            pad = " ".join(f"w{i}x{j}" for j in range(text_bytes // 8))[:text_bytes]  # varied, JSON-plain
            handle.write(json.dumps({"id": i, "text": f"row {i} " + "w" * (i % 50) + pad}) + "\n")
    return path


def op_args(mode: str, *, load_secs: float, batch_secs: float, batch_size: int, record: Path) -> dict:
    args = {
        "load_secs": load_secs,
        "batch_secs": batch_secs,
        "record_path": str(record),
        "batch_size": batch_size,
        "num_proc": 1,
    }
    if mode == "actor":
        args["ray_execution_mode"] = "actor"  # what use_cuda() selects on a GPU node
    return args


def write_recipe(work: Path, data: Path, process: list, *, shards: int, ray_cpus: int) -> Path:
    recipe = {
        "project_name": "bench-warm",
        "executor_type": "elastic_sharded",
        "dataset_path": str(data),
        "export_path": str(work / "merged.jsonl"),
        "custom_operator_paths": [str(OPS)],
        "process": process,
        "elastic": {"job_dir": str(work / "job"), "num_shards": shards, "ray_num_cpus": ray_cpus},
    }
    path = work / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _run(cmd: list[str], log: Path, env: dict) -> float:
    start = time.monotonic()
    with open(log, "a") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
    return time.monotonic() - start


def shard_of(job: Path) -> list[int]:
    """First row id of each shard, in manifest order (shards hold consecutive input rows)."""
    starts, at = [], 0
    for shard in json.loads((job / "manifest.json").read_text())["shards"]:
        starts.append(at)
        at += shard["rows"]
    return starts


def analyse(record: Path, starts: list[int], worker_pid: int, wall: float) -> dict:
    """Loads per process, busy fraction and boundary gaps from the operator's record."""
    events = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    loads = Counter("worker" if e["pid"] == worker_pid else f"ray:{e['pid']}" for e in events if e["event"] == "load")
    batches = sorted((e for e in events if e["event"] == "batch"), key=lambda e: e["t0"])
    busy, end = 0.0, None  # union of the batch intervals
    for b in batches:
        lo = b["t0"] if end is None else max(b["t0"], end)
        if b["t1"] > lo:
            busy += b["t1"] - lo
        end = b["t1"] if end is None else max(end, b["t1"])
    span = batches[-1]["t1"] - batches[0]["t0"]
    by_shard: dict[int, list[dict]] = {}
    for b in batches:
        k = max(i for i, s in enumerate(starts) if s <= b["first"])
        by_shard.setdefault(k, []).append(b)
    # in the order the worker ran the shards (it need not start at the first one)
    ran = sorted(by_shard.values(), key=lambda shard: min(b["t0"] for b in shard))
    gaps = [min(b["t0"] for b in nxt) - max(b["t1"] for b in cur) for cur, nxt in zip(ran, ran[1:], strict=False)]
    return {
        "loads_total": sum(loads.values()),
        "loads_per_process": dict(sorted(loads.items())),
        "batches": len(batches),
        "busy_fraction_batches": round(busy / span, 3),
        "busy_fraction_wall": round(busy / wall, 3),
        "busy_secs": round(busy, 2),
        "span_secs": round(span, 2),
        "worker_wall_secs": round(wall, 2),
        "gap_max_secs": round(max(gaps), 3) if gaps else None,
        "gap_mean_secs": round(sum(gaps) / len(gaps), 3) if gaps else None,
        "gaps_secs": [round(g, 3) for g in gaps],
    }


def run_mode(mode: str, work: Path, args: argparse.Namespace, env: dict) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    data = write_input(work / "input.jsonl", args.shards * args.rows_per_shard, args.text_bytes)
    record = work / "record.jsonl"
    process = [
        {
            "bench_heavy_load_mapper": op_args(
                mode, load_secs=args.load_secs, batch_secs=args.batch_secs, batch_size=args.batch_size, record=record
            )
        }
    ]
    recipe = write_recipe(work, data, process, shards=args.shards, ray_cpus=args.ray_num_cpus)
    log = work / "run.log"
    _run(["dj-elastic", "prepare", "--config", str(recipe)], log, env)
    record.unlink(missing_ok=True)  # prepare computes stage identities: that builds the operator once
    start = time.monotonic()
    with open(log, "a") as out:
        proc = subprocess.Popen(
            ["dj-elastic", "worker", "--job-dir", str(work / "job"), "--no-wait"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
        )
        rc = proc.wait()
    wall = time.monotonic() - start
    if rc != 0:
        raise SystemExit(f"worker failed ({rc}); see {log}")
    _run(["dj-elastic", "merge", "--job-dir", str(work / "job"), "--output", str(work / "merged.jsonl")], log, env)
    merged = [json.loads(line) for line in (work / "merged.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in data.read_text().splitlines()]
    result = analyse(record, shard_of(work / "job"), proc.pid, wall)
    result["output_matches_input"] = merged == expected
    result["output_bytes_equal_input"] = (work / "merged.jsonl").read_bytes() == data.read_bytes()
    result["worker_pid"] = proc.pid
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-bench-warm"))
    parser.add_argument("--mode", choices=("task", "actor", "both"), default="both")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rows-per-shard", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--text-bytes", type=int, default=0, help="extra text per row (bigger shards to read)")
    parser.add_argument("--batch-secs", type=float, default=0.5)
    parser.add_argument("--load-secs", type=float, default=3.0)
    parser.add_argument("--ray-num-cpus", type=int, default=2)
    parser.add_argument("--src", type=Path, help="import data_juicer_elastic from this checkout instead of this one")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    src = args.src or REPO
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}
    modes = ("task", "actor") if args.mode == "both" else (args.mode,)
    results = {"load_avg_before": os.getloadavg(), "src": str(src), "settings": vars(args) | {"src": str(src)}}
    for mode in modes:
        results[mode] = run_mode(mode, args.workdir / mode, args, env)
        print(f"{mode}: {json.dumps(results[mode])}", flush=True)
    results["load_avg_after"] = os.getloadavg()
    print(f"load average before {results['load_avg_before']}, after {results['load_avg_after']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
