"""Elastic sharded execution vs Data-Juicer's plain Ray executor, measured in one run.

Times the demo recipe over a generated dataset with:

  (a) plain    Data-Juicer's `ray` executor, one `dj-process`;
  (b) elastic  `executor_type: elastic_sharded`, 8 shards, one worker (one warm Ray runtime);
  (c) cold     the prior tool's way: prepare, then one `dj-process` (own local Ray) per shard, then merge;
  (d) elastic with 4 and 32 shards, to get the added cost per extra shard.

Every variant is a fresh subprocess through the real commands.  Reported
figures are ratios against (a) measured in the same run, since these
machines are shared and noisy.

    python benchmarks/bench_sharded.py --rows 200000 --workdir /tmp/dje-bench
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

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "demos"))
from generate_data import write_dataset  # noqa: E402

PROCESS = [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 10, "max_len": 10000}}]


def _recipe(path: Path, **fields) -> Path:
    base = {"project_name": "bench", "np": os.cpu_count() or 2, "ray_address": "local", "process": PROCESS}
    base.update(fields)
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


def _timed(cmd: list[str], log: Path) -> float:
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
    return elapsed


def run_plain(work: Path, data: Path) -> float:
    recipe = _recipe(
        work / "plain.yaml", executor_type="ray", dataset_path=str(data), export_path=str(work / "plain" / "out.jsonl")
    )
    return _timed(["dj-process", "--config", str(recipe)], work / "plain.log")


def run_elastic(work: Path, data: Path, shards: int) -> float:
    name = f"elastic-{shards}"
    recipe = _recipe(
        work / f"{name}.yaml",
        executor_type="elastic_sharded",
        dataset_path=str(data),
        export_path=str(work / name / "merged.jsonl"),
        elastic={"job_dir": str(work / name / "job"), "num_shards": shards},
    )
    return _timed(["dj-process", "--config", str(recipe)], work / f"{name}.log")


def run_cold_per_shard(work: Path, data: Path, shards: int) -> float:
    """Prepare, one dj-process (its own local Ray) per shard, then merge: the prior tool's cost model."""
    job = work / "cold" / "job"
    recipe = _recipe(
        work / "cold.yaml",
        executor_type="elastic_sharded",
        dataset_path=str(data),
        export_path=str(work / "cold" / "merged.jsonl"),
        elastic={"job_dir": str(job), "num_shards": shards},
    )
    shard_recipe = _recipe(work / "cold-shard.yaml", executor_type="ray")
    start = time.perf_counter()
    _timed(["dj-elastic", "prepare", "--config", str(recipe)], work / "cold-prepare.log")
    manifest = json.loads((job / "manifest.json").read_text())
    outputs = []
    for shard in manifest["shards"]:
        shard_id = shard["shard_id"]
        out = work / "cold" / "out" / shard_id
        _timed(
            [
                "dj-process",
                "--config",
                str(shard_recipe),
                "--dataset_path",
                str(job / "shards" / f"{shard_id}.jsonl"),
                "--export_path",
                str(out / "out.jsonl"),
            ],
            work / f"cold-{shard_id}.log",
        )
        outputs.append(out / "out.jsonl")
    with open(work / "cold" / "merged.jsonl", "wb") as merged:
        for out in outputs:
            parts = sorted(out.iterdir()) if out.is_dir() else [out]
            for part in parts:
                merged.write(part.read_bytes())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-bench"))
    parser.add_argument("--skip-cold", action="store_true", help="skip (c), the slowest variant")
    args = parser.parse_args()

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    data = write_dataset(args.workdir / "input.jsonl", args.rows)
    size_mb = data.stat().st_size / 1e6
    print(f"input: {args.rows} rows, {size_mb:.1f} MB, {os.cpu_count()} CPUs")

    results = {"plain_ray": run_plain(args.workdir, data)}
    results["elastic_8"] = run_elastic(args.workdir, data, 8)
    results["elastic_4"] = run_elastic(args.workdir, data, 4)
    results["elastic_32"] = run_elastic(args.workdir, data, 32)
    if not args.skip_cold:
        results["cold_per_shard_8"] = run_cold_per_shard(args.workdir, data, 8)

    for name, secs in results.items():
        print(f"{name:>18}: {secs:7.1f} s  ({secs / results['plain_ray']:.2f} x plain ray)")
    per_shard = (results["elastic_32"] - results["elastic_4"]) / 28
    print(f"elastic_8 / plain_ray = {results['elastic_8'] / results['plain_ray']:.3f}  (target <= 1.15)")
    print(f"added cost per extra shard (32 vs 4) = {per_shard:.2f} s  (target < 1 s)")
    if "cold_per_shard_8" in results:
        print(f"cold_per_shard_8 / elastic_8 = {results['cold_per_shard_8'] / results['elastic_8']:.2f}")
    (args.workdir / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
