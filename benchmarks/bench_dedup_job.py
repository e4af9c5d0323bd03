"""A whole deduplicating job: elastic_sharded against Data-Juicer's ``default`` executor, measured in one run.

The issue's target: one node, 200k rows, ``document_minhash_deduplicator`` at Data-Juicer's defaults;
``elastic_sharded`` (8 shards) at most 1.0x the ``default`` executor's (``np: 2``) wall time, and where
the elastic run's time went, phase by phase.

The input is generated (no download, seeded): documents of 50-400 words drawn from a vocabulary with a
Zipf-like distribution, some short ones (5-40 words, and a few under MinHash's 5-token window, which all
fall in one cluster), and about ``--copies`` of the rows copies of earlier documents placed far apart
(after the first tenth of the rows) (exact
copies, case and punctuation variants, near copies with a few words replaced).  Every row has an ``id``.

Each variant is a fresh ``dj-process`` on the same recipe (``np: 2``, ``--mapper`` adds a cheap Mapper
before the deduplicator), one after the other, the order reversed every other round:

  default   Data-Juicer's ``default`` executor
  elastic   ``executor_type: elastic_sharded``, ``num_shards`` = ``--shards``, one worker, the defaults

Printed per round: both wall times, the ratio, the load average, the default run's split (from its log:
before the deduplicator, ``compute_hash`` in ``np`` processes, Data-Juicer's ``process``, the export),
and the elastic run's phases from its job directory (the attempt records of each phase's tasks,
``dedup/<k>/<phase>/`` and the shards': from the first attempt's start to the last one's end, the
attempts' summed seconds, and for the signatures and the shards the seconds Ray Data ran the operators,
from the attempts' logs), plus the time before the first attempt (start, recipe check, preparation) and
after the last one (the merge).  The first round checks that both outputs keep the same rows (the ids,
in order) with the same values (parsed: the two executors space their JSON differently).
The result (every round, the medians) goes to ``<workdir>/results.json``.

    python benchmarks/bench_dedup_job.py                       # 200,000 rows, 8 shards, one round: 10-20 min
    python benchmarks/bench_dedup_job.py --rows 5000 --rounds 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shutil
import statistics
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sharded import _recipe, _timed  # noqa: E402

DEDUP = {"document_minhash_deduplicator": None}  # Data-Juicer's defaults
MAPPER = {"whitespace_normalization_mapper": None}
PHASES = ("signatures", "buckets", "cluster")


# ---- the input ---------------------------------------------------------------------------------------


def corpus(rows: int, copies: float, seed: int = 7) -> list[str]:
    """``rows`` documents; a ``copies`` share of them copies of earlier ones, placed far apart."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocabulary = ["".join(rng.choice(letters) for _ in range(rng.randrange(2, 10))) for _ in range(50_000)]
    weights = list(itertools.accumulate(1 / (rank + 1) ** 1.1 for rank in range(len(vocabulary))))

    def words(n: int) -> list[str]:
        return rng.choices(vocabulary, cum_weights=weights, k=n)

    def document() -> str:
        draw = rng.random()
        n = rng.randrange(1, 5) if draw < 0.005 else rng.randrange(5, 40) if draw < 0.08 else rng.randrange(50, 401)
        text = words(n)
        for index in range(0, len(text), rng.randrange(8, 25)):  # sentences
            text[index] = text[index].capitalize()
            if index:
                text[index - 1] += "."
        return " ".join(text) + "."

    docs: list[str] = []
    for row in range(rows):
        if row < max(1, rows // 10) or rng.random() >= copies:
            docs.append(document())
            continue
        tokens = docs[rng.randrange(0, row - rows // 20)].split(" ")  # an original at least 5 % of the rows back
        kind = rng.randrange(3)
        if kind == 1:  # case and punctuation
            tokens = [t.upper() if rng.random() < 0.05 else t for t in tokens]
            tokens = [t + rng.choice(",;!?") if rng.random() < 0.05 else t for t in tokens]
        elif kind == 2:  # near copy: about 3 % of the words replaced
            tokens = [words(1)[0] if rng.random() < 0.03 else t for t in tokens]
        docs.append(" ".join(tokens))
    return docs


def write_input(path: Path, docs: list[str]) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for row, text in enumerate(docs):
            out.write(json.dumps({"id": f"r{row:07d}", "text": text}) + "\n")
    return path


# ---- the runs ----------------------------------------------------------------------------------------


def run(work: Path, data: Path, name: str, args: argparse.Namespace) -> dict:
    out = work / name
    shutil.rmtree(out, ignore_errors=True)  # a finished elastic job would make the next round a no-op
    fields: dict = {"dataset_path": str(data), "export_path": str(out / "out.jsonl"), "np": args.np}
    fields["process"] = ([MAPPER] if args.mapper else []) + [DEDUP]
    if name == "default":
        fields["executor_type"] = "default"
    else:
        fields.update(executor_type="elastic_sharded", elastic={"job_dir": str(out / "job"), "num_shards": args.shards})
    secs, started = _timed(_recipe(work / f"{name}.yaml", **fields), work / f"{name}.log")
    return {"secs": secs, "started": started, "export": out / "out.jsonl", "job": out / "job"}


def export_files(export: Path) -> list[Path]:
    return sorted(p for p in export.rglob("*") if p.is_file()) if export.is_dir() else [export]


def output_rows(export: Path) -> list[dict]:
    """An export's rows, parsed, in the order written (the two executors' JSON spacing differs)."""
    return [json.loads(line) for f in export_files(export) for line in f.read_text("utf-8").splitlines()]


def output_ids(export: Path) -> list[str]:
    return [row["id"] for row in output_rows(export)]


_RAY_DATA = re.compile(r".*Dataset \S+ execution finished in ([\d.]+) seconds")


def ray_data_secs(folder: Path) -> float:
    """Seconds Ray Data ran the operators (the attempts' "execution finished in") in the task
    namespace ``folder``: the hashing of a signature attempt, the operators of a shard's."""
    return sum(
        float(match.group(1))
        for log in folder.glob("attempts/*/*/process.log")
        for match in map(_RAY_DATA.match, log.read_text(errors="replace").splitlines())
        if match
    )


def _attempts(folder: Path) -> list[tuple[float, float]]:
    """(started_at, ended_at) of every attempt record of the task namespace ``folder``."""
    found = []
    for record in folder.glob("attempts/*/*/attempt.json"):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("started_at") and data.get("ended_at"):
            found.append((float(data["started_at"]), float(data["ended_at"])))
    return found


def elastic_phases(started: float, secs: float, job: Path) -> dict[str, float]:
    """Where an elastic run's time went, from its job directory: per phase (the scans, each stage's
    signatures, buckets, cluster, then the shards), seconds from the first attempt's start to the last one's end
    (``<phase>``) and the attempts' summed seconds (``<phase>_task_secs``); ``before`` from the command's
    start to the first attempt, ``after`` from the last attempt's end to the command's end."""
    folders = {"scans": job / "scans"}
    for stage in sorted((job / "dedup").glob("[0-9]*"), key=lambda p: int(p.name)):
        folders.update({f"dedup{stage.name}_{phase}": stage / phase for phase in PHASES})
    folders["shards"] = job
    spans = {name: _attempts(folder) for name, folder in folders.items()}
    result: dict[str, float] = {}
    for name, found in spans.items():
        if found:
            result[name] = max(e for _, e in found) - min(s for s, _ in found)
            result[f"{name}_task_secs"] = sum(e - s for s, e in found)
            result[f"{name}_tasks"] = len(found)
            if name.endswith("_signatures") or name == "shards":
                result[f"{name}_ray_data_secs"] = ray_data_secs(folders[name])
    every = [span for found in spans.values() for span in found]
    if every:
        result["before"] = min(s for s, _ in every) - started
        result["after"] = started + secs - max(e for _, e in every)
    return result


_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) \|"
# Lines of the default executor's log around the deduplicator (Data-Juicer 1.6.1's wording).
_DEFAULT_MARKS = {
    "hash_start": re.compile(_STAMP + r".*Op\[document_minhash_deduplicator\]"),
    "cluster_start": re.compile(_STAMP + r".*Start clustering for"),
    "kept": re.compile(_STAMP + r".*Keep \d+ samples after MinHash dedup"),
}


def default_phases(started: float, secs: float, log: Path) -> dict[str, float]:
    """Where the default run's time went, from its log: ``before`` (start, config, loading the
    dataset), ``compute_hash`` (the ``np`` processes hashing), ``process`` (Data-Juicer's clustering
    and filter, one process), ``after`` (the rest: export)."""
    stamps: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        for name, pattern in _DEFAULT_MARKS.items():
            match = pattern.match(line)
            if match and name not in stamps:
                stamps[name] = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
    if len(stamps) < len(_DEFAULT_MARKS):
        return {}
    return {
        "before": stamps["hash_start"] - started,
        "compute_hash": stamps["cluster_start"] - stamps["hash_start"],
        "process": stamps["kept"] - stamps["cluster_start"],
        "after": started + secs - stamps["kept"],
    }


def phase_table(phases: dict[str, float]) -> str:
    """The phases in the order they ran, one line each."""
    spans = [n for n in phases if not n.endswith(("_secs", "_tasks")) and n not in ("before", "after")]
    lines = []
    for name in ("before", *spans, "after"):
        if name in phases:
            line = f"    {name:<22} {phases[name]:8.1f} s"
            if name + "_tasks" in phases:
                line += f"  ({phases[name + '_tasks']:.0f} tasks, {phases[name + '_task_secs']:.1f} s summed"
                if name + "_ray_data_secs" in phases:
                    line += f", Ray Data running the operators {phases[name + '_ray_data_secs']:.1f} s"
                line += ")"
            lines.append(line)
    return "\n".join(lines)


def one_round(work: Path, data: Path, args: argparse.Namespace, k: int) -> dict:
    names = ["default", "elastic"] if k % 2 == 0 else ["elastic", "default"]
    load = os.getloadavg()
    runs = {name: run(work, data, name, args) for name in names}
    result: dict = {name: runs[name]["secs"] for name in names}
    result["elastic / default"] = result["elastic"] / result["default"]
    result["load_before"], result["load_after"] = load[0], os.getloadavg()[0]
    print(f"round {k + 1} ({' then '.join(names)}; load {load[0]:.1f} -> {result['load_after']:.1f}): "
          f"default {result['default']:.1f} s, elastic {result['elastic']:.1f} s, "
          f"elastic / default {result['elastic / default']:.3f}", flush=True)  # fmt: skip
    split = default_phases(runs["default"]["started"], runs["default"]["secs"], work / "default.log")
    result["default_phases"] = split
    print("  default: " + ", ".join(f"{name} {value:.1f} s" for name, value in split.items()), flush=True)
    phases = elastic_phases(runs["elastic"]["started"], runs["elastic"]["secs"], runs["elastic"]["job"])
    result["phases"] = phases
    print("  elastic phases (first start to last end; the tasks' summed seconds):", flush=True)
    print(phase_table(phases), flush=True)
    if k == 0:
        default_ids, elastic_ids = output_ids(runs["default"]["export"]), output_ids(runs["elastic"]["export"])
        result.update(rows_in=args.rows, kept_default=len(default_ids), kept_elastic=len(elastic_ids))
        result["same_rows"] = default_ids == elastic_ids
        result["same_values"] = output_rows(runs["default"]["export"]) == output_rows(runs["elastic"]["export"])
        print(f"  kept: default {len(default_ids)}, elastic {len(elastic_ids)} of {args.rows}; same rows "
              f"(ids, in order): {result['same_rows']}; same values: {result['same_values']}", flush=True)  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--copies", type=float, default=0.25, help="share of rows that copy an earlier row")
    parser.add_argument("--shards", type=int, default=8, help="the elastic run's num_shards")
    parser.add_argument("--np", type=int, default=2, help="the recipe's np (both executors)")
    parser.add_argument("--mapper", action="store_true", help="whitespace_normalization_mapper before the deduplicator")
    parser.add_argument("--rounds", type=int, default=1, help="repeat both runs, the order reversed every other round")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-bench-dedup"))
    args = parser.parse_args()

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    data = write_input(args.workdir / "input.jsonl", corpus(args.rows, args.copies))
    print(f"input: {args.rows} rows, {data.stat().st_size / 1e6:.1f} MB, {os.cpu_count()} CPUs; "
          f"recipe: {'whitespace_normalization_mapper, ' if args.mapper else ''}document_minhash_deduplicator "
          f"(defaults), np {args.np}; elastic: {args.shards} shards", flush=True)  # fmt: skip

    rounds = [one_round(args.workdir, data, args, k) for k in range(args.rounds)]
    median = {key: statistics.median(r[key] for r in rounds) for key in ("default", "elastic", "elastic / default")}
    label = "median of rounds" if args.rounds > 1 else "one round"
    print(f"\n| variant | wall seconds ({label}) |\n| --- | ---: |")
    print(f"| default (np {args.np}) | {median['default']:.1f} |\n| elastic_sharded ({args.shards} shards) | "
          f"{median['elastic']:.1f} |\n| elastic / default | {median['elastic / default']:.3f} |")  # fmt: skip
    (args.workdir / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                           "median": median, "rounds": rounds}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
