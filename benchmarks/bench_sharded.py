"""elastic_sharded vs Data-Juicer's own executors on the same recipe and data, measured in one run.

Times the demo's two operators over generated rows, each variant a fresh ``dj-process``:

  default      Data-Juicer's ``default`` executor (the small-job baseline)
  ray          Data-Juicer's plain ``ray`` executor (the large-job baseline)
  elastic_N    ``executor_type: elastic_sharded``, N shards, one worker (one warm local Ray runtime),
               for each N of ``--shards``; the first N is the one compared, the smallest and the
               largest give the added cost per extra shard
  baseline     with ``--baseline-src DIR``: the first elastic_N again with the package imported
               from DIR (another checkout, e.g. ``git worktree add /tmp/dje-old <rev>``), to weigh
               a change against the code before it in the same rounds

These machines are shared and noisy, so the results are ratios against a baseline measured in
the same round; ``--rounds N`` repeats every variant N times, the order reversed every other
round, and reports the medians.  Each round prints where the elastic run's time went (from its
node log) and the load average.  The first round also checks that the elastic output holds the
same texts as each Data-Juicer executor's output.

    python benchmarks/bench_sharded.py --rows 400 --executors default --shards 8 --rounds 3
    python benchmarks/bench_sharded.py --rows 200000 --executors ray --rounds 2
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
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "demos"))
from generate_data import write_dataset  # noqa: E402

# Every child imports this checkout, whatever is installed.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
ENV.pop("DJ_ELASTIC_VERBOSE", None)

_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) \|"
# Lines of the instance's node log (job_dir/logs/<host>/*.log; the console shows fewer, without stamps).
_PHASES = {
    "prepared": re.compile(_STAMP + r".*preparation.* - planned "),
    "ray_ready": re.compile(_STAMP + r".*Ray runtime ready"),
    "shard_done": re.compile(_STAMP + r".*shard_runner.* rows out in ([\d.]+)s"),
    "merged": re.compile(_STAMP + r".*finalize.* - merged \d+ rows"),
}

PROCESS = [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 10, "max_len": 10000}}]


def _recipe(path: Path, **fields) -> Path:
    base = {"project_name": "bench", "np": os.cpu_count() or 2, "ray_address": "local", "process": PROCESS}
    base.update(fields)
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


def _timed(recipe: Path, log: Path, src: Path | None = None) -> tuple[float, float]:
    """Wall seconds of one ``dj-process --config recipe``, and the wall clock it started at."""
    env = ENV
    if src is not None:  # the package (and the Data-Juicer plugin entry point) imported from src
        env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), ENV["PYTHONPATH"]]))}
    started, start = time.time(), time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(["dj-process", "--config", str(recipe)], stdout=out, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"dj-process --config {recipe} failed ({proc.returncode}); see {log}")
    return time.perf_counter() - start, started


def run_variant(work: Path, data: Path, name: str, shards: int | None = None, src: Path | None = None) -> dict:
    """One variant, in ``work/name``: Data-Juicer's ``default`` or ``ray`` executor, or (``shards``
    given) elastic_sharded, with the package imported from ``src`` when given."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)  # a finished elastic job would make the next round a no-op
    fields: dict = {"dataset_path": str(data), "export_path": str(out / "out.jsonl")}
    if shards is None:
        fields["executor_type"] = name
    else:
        fields.update(executor_type="elastic_sharded", elastic={"job_dir": str(out / "job"), "num_shards": shards})
    secs, started = _timed(_recipe(work / f"{name}.yaml", **fields), work / f"{name}.log", src)
    return {"secs": secs, "started": started, "export": out / "out.jsonl", "job": out / "job"}


def output_texts(export: Path) -> list[str]:
    """The texts of an export, sorted (the ``ray`` executor may write a directory of parts)."""
    files = sorted(p for p in export.rglob("*") if p.is_file()) if export.is_dir() else [export]
    return sorted(json.loads(line)["text"] for f in files for line in f.read_text(encoding="utf-8").splitlines())


def elastic_phases(started: float, job: Path) -> dict[str, float]:
    """Seconds per phase of one elastic run, from its start to the timestamps in its node log.

    ``later_shards_mean``: claim to claim of shards 2..N; ``later_shards_dj_run_mean``: the part
    of it from RayExecutor's start to the written output (the runner's "rows out in").
    """
    stamps: dict[str, list[datetime]] = {name: [] for name in _PHASES}
    in_run: list[float] = []
    for log in sorted(job.glob("logs/*/*.log")):
        for line in log.read_text(errors="replace").splitlines():
            head = re.match(_STAMP, line)
            if head is None:
                continue
            for name, pattern in _PHASES.items():
                match = pattern.match(line)
                if match:
                    stamps[name].append(datetime.strptime(head.group(1), "%Y-%m-%d %H:%M:%S.%f"))
                    if name == "shard_done":
                        in_run.append(float(match.group(2)))
    if not all(stamps.values()):
        return {}
    done = stamps["shard_done"]
    gaps = [(b - a).total_seconds() for a, b in zip(done, done[1:], strict=False)]
    return {
        "config_and_prepare": (stamps["prepared"][0] - datetime.fromtimestamp(started)).total_seconds(),
        "ray_start": (stamps["ray_ready"][0] - stamps["prepared"][0]).total_seconds(),
        "first_shard": (done[0] - stamps["ray_ready"][0]).total_seconds(),
        "later_shards_mean": statistics.fmean(gaps) if gaps else 0.0,
        "later_shards_dj_run_mean": statistics.fmean(in_run[1:]) if len(in_run) > 1 else 0.0,
        "finalize": (stamps["merged"][-1] - done[-1]).total_seconds(),
    }


def one_round(work: Path, data: Path, args: argparse.Namespace, k: int) -> dict[str, float]:
    main = f"elastic_{args.shards[0]}"
    names = [*args.executors, *(f"elastic_{n}" for n in args.shards)] + (["baseline"] if args.baseline_src else [])
    load = os.getloadavg()[0]
    runs = {}
    for name in names if k % 2 == 0 else names[::-1]:
        shards = args.shards[0] if name == "baseline" else int(name[8:]) if name.startswith("elastic_") else None
        runs[name] = run_variant(work, data, name, shards, args.baseline_src if name == "baseline" else None)
    results = {name: run["secs"] for name, run in runs.items()}
    for executor in args.executors:
        results[f"{main} / {executor}"] = results[main] / results[executor]
    if "baseline" in results:
        results[f"{main} / baseline"] = results[main] / results["baseline"]
    if len(args.shards) > 1:
        low, high = min(args.shards), max(args.shards)
        results["per_extra_shard"] = (results[f"elastic_{high}"] - results[f"elastic_{low}"]) / (high - low)
    results["load_before"], results["load_after"] = load, os.getloadavg()[0]
    print(f"round {k + 1} (load {load:.1f} -> {results['load_after']:.1f}): "
          + ", ".join(f"{name} {value:.2f}" for name, value in results.items() if not name.startswith("load")),
          flush=True)  # fmt: skip
    phases = elastic_phases(runs[main]["started"], runs[main]["job"])
    if phases:
        print(f"  {main} phases: " + ", ".join(f"{n} {v:.2f} s" for n, v in phases.items()), flush=True)
        results.update({f"{main}_{n}": v for n, v in phases.items()})
    if k == 0:
        texts = output_texts(runs[main]["export"])
        for executor in args.executors:
            same = output_texts(runs[executor]["export"]) == texts
            print(f"  same output texts as the {executor} executor: {same}", flush=True)
            results[f"same_texts_as_{executor}"] = float(same)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-bench"))
    parser.add_argument("--executors", nargs="+", choices=("default", "ray"), default=["default", "ray"],
                        help="Data-Juicer's executors to compare against")  # fmt: skip
    parser.add_argument("--shards", type=int, nargs="+", default=[8, 4, 32],
                        help="elastic runs' shard counts; the first is compared")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1, help="repeat every variant this many times")
    parser.add_argument("--baseline-src", type=Path, help="also run the first elastic variant with this checkout")
    args = parser.parse_args()

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    data = write_dataset(args.workdir / "input.jsonl", args.rows)
    print(f"input: {args.rows} rows, {data.stat().st_size / 1e6:.1f} MB, {os.cpu_count()} CPUs")

    rounds = [one_round(args.workdir, data, args, k) for k in range(args.rounds)]
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0] if all(key in r for r in rounds)}
    label = "median of rounds" if args.rounds > 1 else "one round"
    for key, value in median.items():
        if " / " in key or key == "per_extra_shard":
            print(f"{key} = {value:.3f}  ({label}; rounds {', '.join(f'{r[key]:.3f}' for r in rounds)})")
    (args.workdir / "results.json").write_text(json.dumps({"median": median, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
