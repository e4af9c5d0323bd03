"""The serial part of a job: planning must not grow with the bytes; the scans spread over workers.

Sections (``--sections``, default all):

  prepare  wall of `dj-elastic prepare --config R` (a new process: interpreter, imports, the
           recipe parse, the plan) on an input of ``--size-mb`` and one of 10x that, 32 shards;
           ratio = big / small (target <= 1.3), and the bytes the planner read per cut
           (target <= 1 MiB).  The sides alternate; the median of ``--repeat`` runs.
  scan     the scans of the big input's plan: one scanning process alone, then two at once
           (real `scan_job` over the job directory, the real scanner, no Ray): each one's share
           of the bytes (target 40-60%), the walls and CPU-seconds per GB; with
           ``--baseline-src``, that revision's whole prepare of the same input (it read, checked,
           hashed and wrote every shard on one node) for its CPU-seconds per GB.
  job      the whole job through `dj-process` (the demo recipe) on an input of ``--job-mb``:
           this checkout (plan, scans on the workers, run) with one instance and with two
           instances of one run (2 workers sharing the node's cores), and, with
           ``--baseline-src DIR`` (a checkout of the revision before, e.g. ``git worktree add
           /tmp/dje-old <rev>``), that revision's prepare + run with one instance.

Every figure comes from one run on one machine; on a shared machine absolute seconds follow the
neighbours' load, ratios measured side by side much less so.

    python benchmarks/bench_plan_scan.py --size-mb 150 --job-mb 150 --baseline-src /tmp/dje-old \
        --workdir /tmp/dje-plan --out /tmp/bench_plan_scan.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_io import MB, generate, uptime  # noqa: E402

SHARDS = 32
RECIPE = """\
project_name: bench-plan
executor_type: elastic_sharded
dataset_path: {data}
export_path: {export}
np: 2
elastic:
  job_dir: {job}
  num_shards: {shards}
  ray_address: local
  lease_ttl_secs: 60
  poll_interval_secs: 0.5
process:
  - whitespace_normalization_mapper:
  - text_length_filter: {{min_len: 10, max_len: 100000}}
"""
SCANNER = """
import sys, time
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.scan_loop import scan_job
from data_juicer_elastic.shards.scan import ShardScanner
from data_juicer_elastic.sharedfs.identity import WorkerIdentity
t0 = time.perf_counter()
scan_job(JobLayout(sys.argv[1]), WorkerIdentity.current(sys.argv[2]), ShardScanner(),
         ttl_secs=60, heartbeat_secs=15, max_retries=1, poll_interval_secs=0.2)
print(time.perf_counter() - t0)
"""


def env_for(src: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}


def recipe(work: Path, name: str, data: Path, shards: int = SHARDS) -> Path:
    path = work / f"{name}.yaml"
    text = RECIPE.format(data=data, export=work / name / "out.jsonl", job=work / name / "job", shards=shards)
    path.write_text(text)
    return path


def wall(cmd: list[str], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def prepare_section(work: Path, small: Path, big: Path, repeat: int) -> dict:
    env = env_for(REPO)
    walls: dict[str, list[float]] = {"small": [], "big": []}
    read = {}
    for round_ in range(repeat + 1):  # the first round warms the page cache and imports; dropped
        for name, data in (("small", small), ("big", big)):
            shutil.rmtree(work / name, ignore_errors=True)
            seconds = wall(["dj-elastic", "prepare", "--config", str(recipe(work, name, data))], env)
            if round_:
                walls[name].append(seconds)
            plan = json.loads((work / name / "job" / "plan.json").read_bytes())
            read[name] = plan["planned_bytes_read"]
    small_s, big_s = statistics.median(walls["small"]), statistics.median(walls["big"])
    return {
        "small_mb": small.stat().st_size / MB,
        "big_mb": big.stat().st_size / MB,
        "small_secs": walls["small"],
        "big_secs": walls["big"],
        "ratio": big_s / small_s,
        "bytes_read_per_cut": {name: read[name] / (SHARDS - 1) for name in read},
        "load": uptime(),
    }


def children_cpu() -> float:
    """CPU-seconds of the finished children this process waited for (and their waited-for children)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def scan_section(work: Path, big: Path, baseline: Path | None) -> dict:
    env = env_for(REPO)
    out: dict = {"load_before": uptime()}
    gb = big.stat().st_size / 1e9
    if baseline is not None:  # the whole prepare before: one node reads, checks, hashes and writes every shard
        name = "old-prepare"
        shutil.rmtree(work / name, ignore_errors=True)
        cpu0 = children_cpu()
        seconds = wall(["dj-elastic", "prepare", "--config", str(recipe(work, name, big))], env_for(baseline))
        out["baseline_prepare"] = {"wall_secs": seconds, "cpu_s_per_gb": (children_cpu() - cpu0) / gb}
    for workers in (1, 2):
        name = f"scan{workers}"
        shutil.rmtree(work / name, ignore_errors=True)
        wall(["dj-elastic", "prepare", "--config", str(recipe(work, name, big))], env)
        job = work / name / "job"
        cpu0 = children_cpu()
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen([sys.executable, "-c", SCANNER, str(job), f"node-{k}"], env=env, stdout=subprocess.PIPE)
            for k in range(workers)
        ]
        for proc in procs:
            proc.wait()
        elapsed = time.perf_counter() - t0
        cpu = children_cpu() - cpu0
        shares: dict[str, int] = {}
        for record in (job / "scans" / "done").iterdir():
            data = json.loads(record.read_bytes())
            shares[data["node_id"]] = shares.get(data["node_id"], 0) + data["bytes"]
        total = sum(shares.values())
        out[f"{workers}_worker(s)"] = {
            "wall_secs": elapsed,
            "cpu_s_per_gb": cpu / gb,
            "mb_per_sec": total / MB / elapsed,
            "share": {node: size / total for node, size in sorted(shares.items())},
        }
    out["speedup"] = out["1_worker(s)"]["wall_secs"] / out["2_worker(s)"]["wall_secs"]
    return out


def job_section(work: Path, data: Path, baseline: Path | None) -> dict:
    out: dict = {"input_mb": data.stat().st_size / MB, "load_before": uptime()}
    variants = [("plan+scan, 1 instance", REPO, 1), ("plan+scan, 2 instances", REPO, 2)]
    if baseline is not None:
        variants.append(("baseline prepare+run, 1 instance", baseline, 1))
    for label, src, instances in variants:
        name = "job-" + label.split(",")[0].replace("+", "-").replace(" ", "-") + f"-{instances}"
        shutil.rmtree(work / name, ignore_errors=True)
        config = recipe(work, name, data, shards=16)
        env = {**env_for(src), "DJ_ELASTIC_RUN_ID": f"bench-{name}-{time.time_ns()}"}
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(["dj-process", "--config", str(config)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
            for _ in range(instances)
        ]  # fmt: skip
        for proc in procs:
            _, err = proc.communicate()
            if proc.returncode:
                raise SystemExit(f"{label} failed ({proc.returncode}):\n{err[-3000:]}")
        out[label] = {"wall_secs": time.perf_counter() - t0}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=150)
    parser.add_argument("--job-mb", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-plan-scan"))
    parser.add_argument("--baseline-src", type=Path, default=None)
    parser.add_argument("--sections", default="prepare,scan,job")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    inputs = {}
    for mb in {args.size_mb, 10 * args.size_mb, args.job_mb}:
        path = work / f"input-{mb}mb.jsonl"
        if not path.exists() or path.stat().st_size < mb * MB:
            generate(path, mb * MB)
        inputs[mb] = path
    sections = args.sections.split(",")
    result: dict = {}
    if "prepare" in sections:
        result["prepare"] = prepare_section(work, inputs[args.size_mb], inputs[10 * args.size_mb], args.repeat)
        print(json.dumps({"prepare": result["prepare"]}, indent=1), flush=True)
    if "scan" in sections:
        result["scan"] = scan_section(work, inputs[10 * args.size_mb], args.baseline_src)
        print(json.dumps({"scan": result["scan"]}, indent=1), flush=True)
    if "job" in sections:
        result["job"] = job_section(work, inputs[args.job_mb], args.baseline_src)
        print(json.dumps({"job": result["job"]}, indent=1), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
