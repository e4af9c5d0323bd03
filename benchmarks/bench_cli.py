"""`dj-elastic prepare` / `merge` against the in-process calls they wrap, side by side.

  prepare ratio = wall of `dj-elastic prepare --config R` (a new process: interpreter, imports,
                  recipe parse, prepare) / wall of `prepare_job(request)` in a warm process
  merge ratio   = wall of `dj-elastic merge --job-dir J --output O` / wall of `merge_job(J, O)`
                  in a warm process (the CLI also writes the overall statistics: `finalize`,
                  timed in-process too, so the import cost and the extra work show apart)
  cpu_ratio     = the same with CPU seconds (all threads and child processes): on a shared
                  machine, wall time follows the neighbours' load; CPU seconds much less so

Same input, same recipe (the demo's two operators), same disk; the sides alternate (in-process,
CLI, in-process, ...) after one warm-up round that is dropped, the median of ``--repeat`` runs
is reported, with `uptime` before each section (the machine is shared: ratios measured in one
run are comparable, absolute seconds are not).  Also reported: the wall of importing
Data-Juicer alone (what `prepare` pays to parse the recipe exactly as `dj-process` does), and
which of Data-Juicer / Ray / pandas each of `merge`, `status` and `verify` imports.

    python benchmarks/bench_cli.py --size-mb 500 --repeat 3 --out /tmp/bench_cli.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_io import MB, alternate, generate, timed, uptime, warm  # noqa: E402

RECIPE = """\
project_name: bench-cli
executor_type: elastic_sharded
dataset_path: {data}
export_path: {export}
elastic:
  job_dir: {job}
  num_shards: {shards}
process:
  - whitespace_normalization_mapper:
  - text_length_filter: {{min_len: 10, max_len: 100000}}
"""
# Every child sees this checkout, whatever is installed.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
PROBE = (
    "import sys; from data_juicer_elastic.cli import main; code = main(sys.argv[1:]); "
    "print('LOADED', sorted(m for m in ('data_juicer', 'ray', 'pandas', 'torch') if m in sys.modules)); "
    "sys.exit(code)"
)


def cli(*args: str) -> None:
    proc = subprocess.run(["dj-elastic", *args], env=ENV, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"dj-elastic {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def parse_request(recipe: Path):
    """The PrepareRequest `dj-elastic prepare` builds, built here once (untimed)."""
    from data_juicer.config import init_configs

    from data_juicer_elastic.integration.config_block import settings_from_cfg
    from data_juicer_elastic.preparation import prepare_request

    cfg = init_configs(args=["--config", str(recipe)], load_configs_only=True)
    return prepare_request(cfg, settings_from_cfg(cfg))


def finish(job: Path) -> None:
    """Accepted results for every shard without Ray (tests/rayfree.py: the real reader and writer).
    `dj-elastic prepare` only plans the job: its shards are scanned here first, as a worker would."""
    from data_juicer_elastic.jobdir.layout import JobLayout
    from data_juicer_elastic.jobdir.scan_loop import scan_job
    from data_juicer_elastic.jobdir.worker_loop import run_worker
    from data_juicer_elastic.jobdir.worker_settings import WorkerSettings
    from data_juicer_elastic.shards.scan import ShardScanner
    from data_juicer_elastic.sharedfs.identity import WorkerIdentity
    from tests.rayfree import rayfree_runner

    identity = WorkerIdentity.current("bench")
    lease = {"ttl_secs": 600, "heartbeat_secs": 60, "max_retries": 0, "poll_interval_secs": 1}
    scan_job(JobLayout(job), identity, ShardScanner(), **lease)
    run_worker(job, identity, rayfree_runner(job), WorkerSettings(**lease))


def remove_outputs(export: Path) -> None:
    for path in export.parent.glob(export.stem + "*"):
        path.unlink()


def imports(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], env=ENV, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("LOADED")), "LOADED ?")
    return json.loads(line.split(" ", 1)[1].replace("'", '"')) if proc.returncode == 0 else [f"exit {proc.returncode}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-bench-cli"))
    parser.add_argument("--size-mb", type=float, default=500.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    data, job, export = work / "input.jsonl", work / "job", work / "out" / "merged.jsonl"
    recipe = work / "recipe.yaml"
    recipe.write_text(RECIPE.format(data=data, export=export, job=job, shards=args.shards))
    rows = generate(data, int(args.size_mb * MB))
    size = data.stat().st_size
    results: dict = {"input": {"bytes": size, "rows": rows, "shards": args.shards}, "cpus": os.cpu_count()}
    print(f"input: {size / MB:.0f} MB, {rows} rows; {uptime()}", flush=True)
    warm(data)
    request = parse_request(recipe)

    from data_juicer_elastic.finalize import finalize
    from data_juicer_elastic.shards.merge import merge_job
    from data_juicer_elastic.shards.prepare import prepare_job

    results["uptime_prepare"] = uptime()
    scratch = work / "job-inprocess"
    inproc = request.__class__(**{**request.__dict__, "job_dir": scratch})
    wall, cpu = alternate(
        {
            "prepare_job": (lambda: shutil.rmtree(scratch, ignore_errors=True), lambda: prepare_job(inproc)),
            "dj-elastic prepare": (
                lambda: shutil.rmtree(job, ignore_errors=True),
                lambda: cli("prepare", "--config", str(recipe)),
            ),
            "import data_juicer.config": (None, lambda: subprocess.run(
                [sys.executable, "-c", "import data_juicer.config"], env=ENV, check=True)),
        },
        args.repeat,
    )  # fmt: skip
    shutil.rmtree(scratch, ignore_errors=True)
    results["prepare"] = {
        "wall_s": wall,
        "cpu_s": cpu,
        "ratio": wall["dj-elastic prepare"] / wall["prepare_job"],
        "cpu_ratio": cpu["dj-elastic prepare"] / cpu["prepare_job"],  # steadier than wall on a shared machine
    }

    finish(job)
    results["uptime_merge"] = uptime()
    wall, cpu = alternate(
        {
            "merge_job": (lambda: remove_outputs(export), lambda: merge_job(job, export)),
            "finalize": (lambda: remove_outputs(export), lambda: finalize(job, export)),
            "dj-elastic merge": (
                lambda: remove_outputs(export),
                lambda: cli("merge", "--job-dir", str(job), "--output", str(export)),
            ),
        },
        args.repeat,
    )
    results["merge"] = {
        "wall_s": wall,
        "cpu_s": cpu,
        "ratio": wall["dj-elastic merge"] / wall["merge_job"],
        "cpu_ratio": cpu["dj-elastic merge"] / cpu["merge_job"],
    }
    results["status_s"] = timed(lambda: cli("status", "--job-dir", str(job)))[0]
    results["verify_s"] = timed(lambda: cli("verify", "--job-dir", str(job)))[0]
    results["imports"] = {
        "merge": imports("merge", "--job-dir", str(job), "--output", str(work / "probe.jsonl")),
        "status": imports("status", "--job-dir", str(job)),
        "verify": imports("verify", "--job-dir", str(job)),
    }
    results["uptime_end"] = uptime()
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
