"""The demo job's wall time: Data-Juicer's ``default`` executor vs ``elastic_sharded``.

Both sides run the real ``dj-process`` in a fresh subprocess on the same recipe
(``recipes/demo.yaml``: 400 rows, the demo's two operators, ``np: 2``) and the same data;
only ``executor_type`` differs (the elastic side keeps its ``elastic:`` block, 8 shards, local
Ray).  Rounds alternate the order (default first in odd rounds, elastic first in even ones),
each run gets a fresh output directory, and the load average is read before each run: the
machine is shared, so the ratio of one round is the number to compare, not absolute seconds.

For each elastic run, the phases come from its own node log and its Ray session's logs
(``demo_phases``): imports + config parse, prepare, Ray start, first shard, later shards,
Ray shutdown, finalize; and for the first elastic run, every Ray worker process it started:
when the raylet spawned it, when Python and Ray's core worker were up, and what it ran.

    python benchmarks/bench_demo.py --rounds 3 --out /tmp/bench_demo.json
    git archive <base> | tar -x -C /tmp/base    # the code before a change, measured in the same rounds:
    python benchmarks/bench_demo.py --rounds 3 --compare /tmp/base
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from demo_phases import phases, ray_workers, session_of  # noqa: E402

# Every child sees this checkout, whatever is installed.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
ENV.pop("DJ_ELASTIC_VERBOSE", None)


def dj_process() -> list[str]:
    """The installed ``dj-process`` console script, run by this interpreter (so the child's pid is
    the driver's: the Ray session is named after it; a pyenv shim would be a bash in between)."""
    script = Path(sys.executable).parent / "dj-process"
    if not script.exists():
        found = shutil.which("dj-process")
        if found is None:
            raise SystemExit("dj-process is not installed")
        script = Path(found)
    return [sys.executable, str(script)]


def recipe(workdir: Path, executor: str, run: str) -> Path:
    """The demo recipe with absolute paths into ``workdir/run`` and the given executor."""
    text = (REPO / "recipes" / "demo.yaml").read_text(encoding="utf-8")
    text = text.replace("demos/data/", f"{REPO}/demos/data/").replace("outputs/demo", str(workdir / run))
    text = text.replace("executor_type: elastic_sharded", f"executor_type: {executor}")
    path = workdir / f"{run}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def env_for(code: Path) -> dict[str, str]:
    return {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}


def run_once(workdir: Path, executor: str, run: str, env: dict[str, str] = ENV) -> dict:
    shutil.rmtree(workdir / run, ignore_errors=True)
    config = recipe(workdir, executor, run)
    load = loadavg()
    log = workdir / f"{run}.out"
    started = time.time()
    with open(log, "wb") as out:
        proc = subprocess.Popen([*dj_process(), "--config", str(config)], stdout=out, stderr=subprocess.STDOUT, env=env)
        code = proc.wait()
    ended = time.time()
    if code:
        raise SystemExit(f"{executor} run failed ({code}); see {log}")
    result = {"executor": executor, "wall": ended - started, "load_before": load, "load_after": loadavg()}
    export = workdir / run / "merged.jsonl"
    result["rows_out"] = sum(1 for _ in open(export, "rb")) if export.exists() else None
    if executor != "default":
        node_logs = sorted((workdir / run / "job" / "logs").glob("*/*.log"))
        if node_logs:
            result["phases"] = phases(started, ended, node_logs[-1])
        session = session_of(proc.pid)
        if session is not None:
            result["ray_workers"] = ray_workers(session, started)
    return result


def texts(path: Path) -> list[str]:
    return sorted(json.loads(line)["text"] for line in open(path, encoding="utf-8"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-bench-demo"))
    parser.add_argument("--out", type=Path, default=None, help="write every measurement as JSON here")
    parser.add_argument(
        "--compare",
        type=Path,
        default=None,
        help="another checkout of this package (e.g. `git archive` of the base commit): its elastic run "
        "joins every round, so before and after are measured under the same load",
    )
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run(
        [sys.executable, "-c", "import data_juicer_elastic as m; print(m.__file__)"], env=ENV, capture_output=True
    )
    print(f"plugin code under test: {probe.stdout.decode().strip()}")
    rounds = []
    for k in range(args.rounds):
        order = ["default", "elastic_sharded"] + (["compare"] if args.compare else [])
        order = order if k % 2 == 0 else order[::-1]
        runs = {}
        for side in order:
            env = env_for(args.compare) if side == "compare" else ENV
            executor = "elastic_sharded" if side == "compare" else side
            runs[side] = run_once(args.workdir, executor, f"r{k}-{side}", env)
        d, e = runs["default"], runs["elastic_sharded"]
        ratio = e["wall"] / d["wall"]
        rounds.append({"default": d, "elastic": e, "ratio": ratio})
        print(
            f"round {k + 1}: default {d['wall']:.1f}s (load {d['load_before']}), "
            f"elastic {e['wall']:.1f}s (load {e['load_before']}), ratio {ratio:.2f}; "
            f"rows out {d['rows_out']} / {e['rows_out']}"
        )
        if "compare" in runs:
            c = runs["compare"]
            ratio_c = c["wall"] / d["wall"]
            rounds[-1].update(compare=c, compare_ratio=ratio_c)
            print(f"   compared code: elastic {c['wall']:.1f}s (load {c['load_before']}), ratio {ratio_c:.2f}")
            if "phases" in c:
                print("   compared phases: " + ", ".join(f"{n} {v:.2f}s" for n, v in c["phases"].items()))
        if "phases" in e:
            print("   elastic phases: " + ", ".join(f"{n} {v:.2f}s" for n, v in e["phases"].items()))
        if k == 0:
            same = texts(args.workdir / "r0-default/merged.jsonl") == texts(
                args.workdir / "r0-elastic_sharded/merged.jsonl"
            )
            print(f"   same output texts as the default executor: {same}")
            for w in e.get("ray_workers", []):
                up = w.get("core_worker_up")
                print(
                    f"   ray worker {w['pid']}: spawned +{w['spawned']:.2f}s, "
                    f"core worker up +{up:.2f}s, ran {w['roles']}"
                    if up is not None
                    else f"   ray worker {w['pid']}: spawned +{w['spawned']:.2f}s, ran {w['roles']}"
                )
    walls = {side: statistics.median(r[side]["wall"] for r in rounds) for side in ("default", "elastic")}
    ratios = [r["ratio"] for r in rounds]
    if args.compare:
        cr = [r["compare_ratio"] for r in rounds]
        print(f"compared code: ratio median {statistics.median(cr):.2f} (rounds {', '.join(f'{x:.2f}' for x in cr)})")
    print(
        f"median: default {walls['default']:.1f}s, elastic {walls['elastic']:.1f}s; "
        f"ratio median {statistics.median(ratios):.2f} (rounds {', '.join(f'{x:.2f}' for x in ratios)})"
    )
    if args.out:
        args.out.write_text(json.dumps(rounds, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
