"""Two claim slots on one node: threads over one warm Ray runtime vs one warm runtime per slot.

The measurement behind the ``slots_per_node`` design (see benchmarks/README.md):

  (seq)      one worker, one slot: the baseline;
  (threads)  one process, one warm Ray runtime with all CPUs, S threads each running the
             worker loop with its own ShardRunner over the shared runtime;
  (procs)    S worker processes (what ``dj-elastic worker --slots S`` does), each with its
             own warm runtime and CPUs / S.

Reported per variant: wall time, peak summed RSS of the process tree (Ray's raylet, GCS and
workers included), and whether every attempt's process.log holds only its own shard's lines.

    python benchmarks/bench_slots.py --rows 40000 --shards 8 --slots 2 --workdir /tmp/dje-slots
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "demos"))
from generate_data import write_dataset  # noqa: E402

SLEEP_OPS = REPO / "tests" / "e2e" / "ops" / "e2e_ops.py"  # e2e_sleep_mapper: an accelerator/IO-bound stand-in
PROCESS = [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 10, "max_len": 10000}}]

_THREADS = """
import sys, threading, time
from pathlib import Path
from data_juicer_elastic.execution.ray_runtime import WarmRayRuntime
from data_juicer_elastic.execution.shard_runner import ShardRunner, shard_runtime_env
from data_juicer_elastic.sharedfs.identity import WorkerIdentity
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.scan_loop import scan_job
from data_juicer_elastic.jobdir.worker_loop import run_worker
from data_juicer_elastic.jobdir.worker_settings import WorkerSettings
from data_juicer_elastic.shards.scan import ShardScanner

job, slots, cpus = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
# `dj-elastic prepare` plans the job; its shards are scanned first, as a worker does (the runners need the manifest)
manifest = scan_job(JobLayout(job), WorkerIdentity.current("threads"), ShardScanner(), ttl_secs=60, heartbeat_secs=5,
                    max_retries=0, poll_interval_secs=0.5)
cache = JobLayout(job).cache_dir
errors = []
with WarmRayRuntime("local", cpus, runtime_env=shard_runtime_env(manifest.recipe, cache)):
    def slot(k):
        try:
            runner = ShardRunner(
                manifest.recipe, list(manifest.stage_identities), cache, row_schema=manifest.row_schema
            )
            settings = WorkerSettings(ttl_secs=60, heartbeat_secs=5, max_retries=0, poll_interval_secs=0.5,
                                      wait_for_completion=False)
            run_worker(job, WorkerIdentity.current(f"threads-slot{k}"), runner, settings)
        except BaseException as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=slot, args=(k,)) for k in range(slots)]
    [t.start() for t in threads]
    [t.join() for t in threads]
print("ERRORS", errors)
"""


def _recipe(path: Path, data: Path, job: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "project_name": "bench-slots",
                "np": 1,
                "executor_type": "elastic_sharded",
                "dataset_path": str(data),
                "export_path": str(job.parent / "merged.jsonl"),
                "elastic": {"job_dir": str(job), "num_shards": ARGS.shards, "max_retries": 0},
                "process": (
                    [{"e2e_sleep_mapper": {"seconds_per_row": ARGS.sleep_per_row}}] if ARGS.sleep_per_row else []
                )
                + PROCESS,
                **({"custom_operator_paths": [str(SLEEP_OPS)]} if ARGS.sleep_per_row else {}),
            },
            sort_keys=False,
        )
    )
    return path


def _prepare(work: Path, data: Path, name: str) -> Path:
    job = work / name / "job"
    recipe = _recipe(work / f"{name}.yaml", data, job)
    subprocess.run(["dj-elastic", "prepare", "--config", str(recipe)], check=True, capture_output=True)
    return job


def _tree_rss(roots: list[psutil.Process]) -> int:
    seen, total = set(), 0
    for root in roots:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            if proc.pid in seen:
                continue
            seen.add(proc.pid)
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                pass
    return total


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen:
    # To a file, not a pipe: nobody reads a pipe while the worker runs, and a full pipe blocks it.
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)


def _watch(popens: list[subprocess.Popen]) -> tuple[float, int]:
    roots = [psutil.Process(p.pid) for p in popens]
    peak = 0
    start = time.perf_counter()
    while any(p.poll() is None for p in popens):
        peak = max(peak, _tree_rss(roots))
        time.sleep(0.25)
    wall = time.perf_counter() - start
    for p in popens:
        if p.returncode != 0:
            raise SystemExit(f"a worker failed ({p.returncode}); see the .log files in {ARGS.workdir}")
    return wall, peak


def _logs_isolated(job: Path) -> bool:
    """Each process.log names only its own shard."""
    for log in job.glob("attempts/*/*/process.log"):
        own = log.parent.parent.name
        others = set(re.findall(r"part-\d{5}-of-\d{5}", log.read_text(errors="replace"))) - {own}
        if others:
            return False
    return True


def _overlap(job: Path) -> float:
    """Seconds during which two attempts ran at once (from attempt.json)."""
    spans = sorted(
        (rec["started_at"], rec["ended_at"])
        for rec in (json.loads(p.read_text()) for p in job.glob("attempts/*/*/attempt.json"))
        if rec.get("ended_at")
    )
    total = 0.0
    for (_, e1), (s2, e2) in zip(spans, spans[1:], strict=False):
        total += max(0.0, min(e1, e2) - s2)
    return total


def run_seq(work: Path, data: Path) -> dict:
    job = _prepare(work, data, "seq")
    cmd = ["dj-elastic", "worker", "--job-dir", str(job), "--no-wait", "--ray-num-cpus", str(ARGS.cpus)]
    wall, peak = _watch([_spawn(cmd, work / "seq.log")])
    return {"wall_s": wall, "peak_rss_mb": peak / 1e6, "logs_isolated": _logs_isolated(job), "overlap_s": _overlap(job)}


def run_threads(work: Path, data: Path) -> dict:
    job = _prepare(work, data, "threads")
    cmd = [sys.executable, "-c", _THREADS, str(job), str(ARGS.slots), str(ARGS.cpus)]
    wall, peak = _watch([_spawn(cmd, work / "threads.log")])
    errors = [line for line in (work / "threads.log").read_text().splitlines() if line.startswith("ERRORS")]
    done = len(list((job / "done").glob("*.json")))
    return {
        "wall_s": wall,
        "peak_rss_mb": peak / 1e6,
        "logs_isolated": _logs_isolated(job),
        "overlap_s": _overlap(job),
        "done": done,
        "errors": errors[-1] if errors else "no ERRORS line",
    }


def run_procs(work: Path, data: Path) -> dict:
    job = _prepare(work, data, "procs")
    cmd = ["dj-elastic", "worker", "--job-dir", str(job), "--no-wait", "--slots", str(ARGS.slots)]
    cmd += ["--ray-num-cpus", str(max(1, ARGS.cpus // ARGS.slots))]
    wall, peak = _watch([_spawn(cmd, work / "procs.log")])
    return {"wall_s": wall, "peak_rss_mb": peak / 1e6, "logs_isolated": _logs_isolated(job), "overlap_s": _overlap(job)}


def main() -> None:
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-slots"))
    parser.add_argument("--variants", default="seq,threads,procs")
    parser.add_argument("--sleep-per-row", type=float, default=0.0, help="add a sleeping op (waits, not CPU)")
    ARGS = parser.parse_args()
    shutil.rmtree(ARGS.workdir, ignore_errors=True)
    ARGS.workdir.mkdir(parents=True)
    data = write_dataset(ARGS.workdir / "input.jsonl", ARGS.rows)
    print(f"{ARGS.rows} rows, {ARGS.shards} shards, {ARGS.slots} slots, {ARGS.cpus} CPUs, sleep {ARGS.sleep_per_row}")
    runners = {"seq": run_seq, "threads": run_threads, "procs": run_procs}
    results = {}
    for name in ARGS.variants.split(","):
        results[name] = runners[name](ARGS.workdir, data)
        print(name, json.dumps(results[name]), flush=True)
    (ARGS.workdir / "results.json").write_text(json.dumps(results, indent=2))


ARGS: argparse.Namespace

if __name__ == "__main__":
    main()
