"""Elastic sharded execution vs Data-Juicer's plain Ray executor, measured in one run.

Times the demo recipe over a generated dataset with:

  (a) plain    Data-Juicer's `ray` executor, one `dj-process`;
  (b) elastic  `executor_type: elastic_sharded`, 8 shards, one worker (one warm Ray runtime);
  (c) cold     the prior tool's way: prepare, then one `dj-process` (own local Ray) per shard, then merge;
  (d) elastic with 4 and 32 shards, to get the added cost per extra shard;
  (e) with ``--baseline-src DIR``: (b) again with the package imported from DIR (a checkout of
      an earlier revision, e.g. ``git worktree add /tmp/dje-old <rev>``), to weigh a change
      against the code before it in the same run (``elastic_8 / elastic_8_baseline``).

Every variant is a fresh subprocess through the real commands.  Reported
figures are ratios against (a) measured in the same run, since these
machines are shared and noisy; ``--rounds N`` repeats (a), (b), (d) N times,
interleaved, and reports each round and the medians.  Each round also prints
where (b)'s time went, read from its log, and the load average.

    python benchmarks/bench_sharded.py --rows 200000 --workdir /tmp/dje-bench
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) \|"
# Lines of the instance's node log (job_dir/logs/<host>/*.log; the console shows fewer, without stamps).
_PHASES = {
    "prepared": re.compile(_STAMP + r".*preparation.* - planned "),
    "ray_ready": re.compile(_STAMP + r".*Ray runtime ready"),
    "shard_done": re.compile(_STAMP + r".*shard_runner.* rows out in ([\d.]+)s"),
    "merged": re.compile(_STAMP + r".*finalize.* - merged \d+ rows"),
}
_STARTED: dict[Path, float] = {}  # each command's log -> the wall clock when it was started

PROCESS = [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 10, "max_len": 10000}}]


def _recipe(path: Path, **fields) -> Path:
    base = {"project_name": "bench", "np": os.cpu_count() or 2, "ray_address": "local", "process": PROCESS}
    base.update(fields)
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


def _timed(cmd: list[str], log: Path, src: Path | None = None) -> float:
    env = None
    if src is not None:  # the package (and the Data-Juicer plugin entry point) imported from src
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    _STARTED[log] = time.time()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
    return elapsed


def run_plain(work: Path, data: Path) -> float:
    recipe = _recipe(
        work / "plain.yaml", executor_type="ray", dataset_path=str(data), export_path=str(work / "plain" / "out.jsonl")
    )
    return _timed(["dj-process", "--config", str(recipe)], work / "plain.log")


def run_elastic(work: Path, data: Path, shards: int, src: Path | None = None) -> float:
    name = f"elastic-{shards}" + ("-baseline" if src is not None else "")
    shutil.rmtree(work / name, ignore_errors=True)  # a finished job would make the next round a no-op
    recipe = _recipe(
        work / f"{name}.yaml",
        executor_type="elastic_sharded",
        dataset_path=str(data),
        export_path=str(work / name / "merged.jsonl"),
        elastic={"job_dir": str(work / name / "job"), "num_shards": shards},
    )
    return _timed(["dj-process", "--config", str(recipe)], work / f"{name}.log", src)


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
    shard_files = split_shards(job, work / "cold" / "shards")
    outputs = []
    for shard_id, shard_file in shard_files.items():
        out = work / "cold" / "out" / shard_id
        _timed(
            [
                "dj-process",
                "--config",
                str(shard_recipe),
                "--dataset_path",
                str(shard_file),
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


def split_shards(job: Path, into: Path) -> dict[str, Path]:
    """The planned job's shards as files (what a splitting prepare writes): scanned as a worker scans
    them, then each shard's rows copied out, in order."""
    from data_juicer_elastic.jobdir.layout import JobLayout
    from data_juicer_elastic.jobdir.manifest import locate_shard
    from data_juicer_elastic.jobdir.scan_loop import scan_job
    from data_juicer_elastic.rows.shard_source import iter_source_lines
    from data_juicer_elastic.shards.scan import ShardScanner
    from data_juicer_elastic.sharedfs.identity import WorkerIdentity

    layout = JobLayout(job)
    lease = {"ttl_secs": 600, "heartbeat_secs": 60, "max_retries": 0, "poll_interval_secs": 1}
    manifest = scan_job(layout, WorkerIdentity.current("bench"), ShardScanner(), **lease)
    into.mkdir(parents=True, exist_ok=True)
    files = {}
    for entry in manifest.shards:
        files[entry.shard_id] = into / f"{entry.shard_id}.jsonl"
        with open(files[entry.shard_id], "wb") as out:
            out.writelines(line + b"\n" for line in iter_source_lines(locate_shard(layout, manifest, entry)))
    return files


def elastic_phases(console_log: Path, job: Path) -> dict[str, float]:
    """Seconds per phase of one elastic run: from the command's start to the timestamps in the node
    log of its job directory.

    ``later_shards_mean``: claim to claim of shards 2..N; ``later_shards_dj_run_mean``: the
    part of it from RayExecutor's start to the canonical output (the runner's "rows out in").
    """
    from datetime import datetime

    stamps: dict[str, list[datetime]] = {name: [] for name in _PHASES}
    in_run: list[float] = []
    first = datetime.fromtimestamp(_STARTED[console_log]) if console_log in _STARTED else None
    lines = [line for log in sorted(job.glob("logs/*/*.log")) for line in log.read_text(errors="replace").splitlines()]
    for line in lines:
        head = re.match(_STAMP, line)
        if head is None:
            continue
        when = datetime.strptime(head.group(1), "%Y-%m-%d %H:%M:%S.%f")
        first = first or when
        for name, pattern in _PHASES.items():
            match = pattern.match(line)
            if match:
                stamps[name].append(when)
                if name == "shard_done":
                    in_run.append(float(match.group(2)))
    if first is None or not all(stamps.values()):
        return {}
    done = stamps["shard_done"]
    gaps = [(b - a).total_seconds() for a, b in zip(done, done[1:], strict=False)]
    return {
        "config_and_prepare": (stamps["prepared"][0] - first).total_seconds(),
        "ray_start": (stamps["ray_ready"][0] - stamps["prepared"][0]).total_seconds(),
        "first_shard": (done[0] - stamps["ray_ready"][0]).total_seconds(),
        "later_shards_mean": statistics.fmean(gaps) if gaps else 0.0,
        "later_shards_dj_run_mean": statistics.fmean(in_run[1:]) if len(in_run) > 1 else 0.0,
        "finalize": (stamps["merged"][-1] - done[-1]).total_seconds(),
    }


def one_round(work: Path, data: Path, baseline: Path | None = None) -> dict[str, float]:
    load = os.getloadavg()[0]
    results = {"plain_ray": run_plain(work, data)}
    results["elastic_8"] = run_elastic(work, data, 8)
    phases = elastic_phases(work / "elastic-8.log", work / "elastic-8" / "job")
    if baseline is not None:
        results["elastic_8_baseline"] = run_elastic(work, data, 8, baseline)
        results["ratio_to_baseline"] = results["elastic_8"] / results["elastic_8_baseline"]
        print(
            f"  elastic_8 {results['elastic_8']:.1f} s vs baseline {results['elastic_8_baseline']:.1f} s "
            f"-> {results['ratio_to_baseline']:.3f}",
            flush=True,
        )
    results["elastic_4"] = run_elastic(work, data, 4)
    results["elastic_32"] = run_elastic(work, data, 32)
    results["ratio_8"] = results["elastic_8"] / results["plain_ray"]
    results["per_extra_shard"] = (results["elastic_32"] - results["elastic_4"]) / 28
    results["load_before"], results["load_after"] = load, os.getloadavg()[0]
    print(
        f"round: plain {results['plain_ray']:.1f} s, elastic 8/4/32 shards {results['elastic_8']:.1f} / "
        f"{results['elastic_4']:.1f} / {results['elastic_32']:.1f} s -> ratio {results['ratio_8']:.3f}, "
        f"{results['per_extra_shard']:.2f} s per extra shard (load {load:.1f} -> {results['load_after']:.1f})",
        flush=True,
    )
    if phases:
        print("  elastic_8 phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()), flush=True)
        results.update({f"elastic_8_{k}": v for k, v in phases.items()})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-bench"))
    parser.add_argument("--skip-cold", action="store_true", help="skip (c), the slowest variant")
    parser.add_argument("--rounds", type=int, default=1, help="repeat (a), (b), (d) this many times, interleaved")
    parser.add_argument("--baseline-src", type=Path, help="also run (b) with the package from this checkout")
    args = parser.parse_args()

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    data = write_dataset(args.workdir / "input.jsonl", args.rows)
    size_mb = data.stat().st_size / 1e6
    print(f"input: {args.rows} rows, {size_mb:.1f} MB, {os.cpu_count()} CPUs")

    rounds = [one_round(args.workdir, data, args.baseline_src) for _ in range(args.rounds)]
    results = {key: statistics.median(r[key] for r in rounds) for key in rounds[0] if all(key in r for r in rounds)}
    if not args.skip_cold:
        results["cold_per_shard_8"] = run_cold_per_shard(args.workdir, data, 8)

    label = "median of rounds" if args.rounds > 1 else "one round"
    for name in ("plain_ray", "elastic_8", "elastic_8_baseline", "elastic_4", "elastic_32", "cold_per_shard_8"):
        if name in results:
            secs = results[name]
            print(f"{name:>18}: {secs:7.1f} s  ({secs / results['plain_ray']:.2f} x plain ray, {label})")
    print(f"elastic_8 / plain_ray = {results['ratio_8']:.3f}  (target <= 1.15; {label})")
    print(f"added cost per extra shard (32 vs 4) = {results['per_extra_shard']:.2f} s  (target < 1 s; {label})")
    if "ratio_to_baseline" in results:
        print(f"elastic_8 / elastic_8_baseline = {results['ratio_to_baseline']:.3f}  ({label})")
    if "cold_per_shard_8" in results:
        print(f"cold_per_shard_8 / elastic_8 = {results['cold_per_shard_8'] / results['elastic_8']:.2f}")
    (args.workdir / "results.json").write_text(json.dumps({"median": results, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
