"""Finalize without a serial pass: the `parts` export layout, and the `file` layout's streaming merge.

  parts   finalize(layout="parts") of a 100-shard job at two total sizes of shard outputs (default
          100 MB and 1,000 MB), alternating with the full merge of the same job (merge_job, what the
          `file` layout does without streaming), medians of --repeat.  Reported: each median, the
          ratio parts(large) / parts(small) (1.0 when it does not grow with the bytes; the bytes grow
          10x) and parts / full merge at each size.
  stream  a job of --stream-shards shards run by one worker whose runner takes --shard-secs per shard
          (a stand-in for the operators), with the streaming merge's follower on a thread as
          `dj-process` runs it (job_run.StreamFollower); then finalize(stream=True) is timed and
          compared with the last shard's run time (its attempt record) and with finalize of the
          same job without the partial (stream=False: the whole merge at finalize).

Jobs are built without Ray: prepare_job on a generated input (bench_io.generate: ~1.7 kB text
rows), each shard's output its input copied (accepted through the real publish_done, which
validates and hashes it), with a per-shard stats summary and a per-row stats file as the Ray
runner writes them (one numeric stat per row), so finalize reads what it reads after a real run.
pandas is imported before timing (finalize overlaps its import with the merge; here the first
run would pay it alone).  The page cache holds everything (warm): on shared storage the bytes a
full merge reads cost more, a parts publication reads none.

    python benchmarks/bench_export.py --workdir /tmp/dje-export
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_io import MB, alternate, generate, uptime  # noqa: E402

from data_juicer_elastic.finalize import finalize  # noqa: E402
from data_juicer_elastic.job_run import StreamFollower  # noqa: E402
from data_juicer_elastic.jobdir.result_records import AttemptRecord  # noqa: E402
from data_juicer_elastic.jobdir.tasks import ShardOutput  # noqa: E402
from data_juicer_elastic.jobdir.worker_loop import run_worker  # noqa: E402
from data_juicer_elastic.jobdir.worker_settings import WorkerSettings  # noqa: E402
from data_juicer_elastic.rows.shard_source import iter_source_lines  # noqa: E402
from data_juicer_elastic.settings import ElasticSettings  # noqa: E402
from data_juicer_elastic.shards.merge import merge_job  # noqa: E402
from data_juicer_elastic.shards.parts import publish_parts  # noqa: E402
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job  # noqa: E402
from data_juicer_elastic.sharedfs.identity import WorkerIdentity  # noqa: E402
from data_juicer_elastic.stats.shard_hook import ShardStatsRecorder  # noqa: E402

STATS = "__dj__stats__"
_never = threading.Event()


def runner(seconds: float = 0.0):
    """run_shard without Ray: the output is the input; a stats summary and a row stats file beside it."""

    def run(task):
        started = time.monotonic()
        out = task.attempt_dir / "output.jsonl"
        row_stats = task.attempt_dir / "row-stats.jsonl"
        recorder = ShardStatsRecorder(task.shard_id, task.attempt_id, task.attempt_dir)
        rows = 0
        with open(out, "wb") as dst, open(row_stats, "wb") as stats:
            for line in iter_source_lines(task.source):
                dst.write(line + b"\n")
                row = {STATS: {"line_bytes": len(line) + 1}}
                stats.write(json.dumps(row, separators=(",", ":")).encode() + b"\n")
                recorder.observe(row)
                rows += 1
        import hashlib

        sha = hashlib.sha256(out.read_bytes()).hexdigest()
        left = seconds - (time.monotonic() - started)
        if left > 0:
            _never.wait(left)
        return ShardOutput(out, rows, stats_path=recorder.write(rows, sha), row_stats_path=row_stats)

    return run


def build(data: Path, job: Path, shards: int, seconds: float = 0.0, during=None) -> None:
    shutil.rmtree(job, ignore_errors=True)
    prepare_job(PrepareRequest(job_dir=job, dataset_path=data, num_shards=shards, recipe={}, stage_identities=[]))
    if during is not None:
        during.start()
    summary = run_worker(
        job,
        WorkerIdentity.current("bench"),
        runner(seconds),
        WorkerSettings(ttl_secs=600, heartbeat_secs=60, max_retries=0, poll_interval_secs=0.2),
    )
    assert summary.complete, summary


def output_bytes(job: Path) -> int:
    return sum(p.stat().st_size for p in job.glob("attempts/*/*/output.jsonl"))


def parts_section(work: Path, sizes_mb: list[int], shards: int, repeat: int) -> dict:
    """Every job built first, then all sides of all sizes alternated in one loop: the sizes see the
    same neighbours and the same disk (an fsync's latency here follows other writers)."""
    out: dict = {}
    sides: dict = {}
    for size in sizes_mb:
        print(f"== building: {shards} shards, {size} MB of outputs; {uptime()}", flush=True)
        data = work / f"input-{size}.jsonl"
        if not data.exists():
            generate(data, size * int(MB))
        job = work / f"job-{size}"
        build(data, job, shards)
        out[size] = {"output_bytes": output_bytes(job)}
        sides.update(parts_sides(job, work / f"parts-{size}", work / f"merged-{size}.jsonl", size))
    print(f"== parts vs full merge, alternating; {uptime()}", flush=True)
    wall, cpu = alternate(sides, repeat)
    for size in sizes_mb:
        for name in ("parts finalize", "parts publish only", "full merge"):
            out[size].setdefault("wall", {})[name] = wall[f"{name} {size} MB"]
            out[size].setdefault("cpu", {})[name] = cpu[f"{name} {size} MB"]
        medians = {side: [round(out[size][kind][side], 3) for kind in ("wall", "cpu")] for side in out[size]["wall"]}
        print(f"   {size} MB medians [wall s, CPU-s]: {json.dumps(medians)}")
    small, large = out[min(sizes_mb)], out[max(sizes_mb)]
    out["ratios"] = {
        "parts_finalize_large_over_small": large["wall"]["parts finalize"] / small["wall"]["parts finalize"],
        "parts_finalize_cpu_large_over_small": large["cpu"]["parts finalize"] / small["cpu"]["parts finalize"],
        "bytes_large_over_small": large["output_bytes"] / small["output_bytes"],
    }
    for size in sizes_mb:
        ratio = out[size]["wall"]["parts finalize"] / out[size]["wall"]["full merge"]
        out["ratios"][f"parts_over_full_merge_{size}mb"] = ratio
    return out


def parts_sides(job: Path, export: Path, merged: Path, size: int) -> dict:
    """(setup, timed) per side: finalize with parts, the parts publication alone, the full merge."""

    def clear_export():
        shutil.rmtree(export, ignore_errors=True)

    return {
        f"parts finalize {size} MB": (clear_export, lambda: finalize(job, export, layout="parts")),
        f"parts publish only {size} MB": (clear_export, lambda: publish_parts(job, export)),
        f"full merge {size} MB": (lambda: merged.unlink(missing_ok=True), lambda: merge_job(job, merged)),
    }


def last_shard_secs(job: Path) -> tuple[str, float]:
    records = [AttemptRecord.parse(p.read_bytes(), p) for p in job.glob("attempts/*/*/attempt.json")]
    last = max(records, key=lambda r: r.ended_at or 0)
    return last.shard_id, (last.ended_at or 0) - last.started_at


def stream_section(work: Path, size: int, shards: int, shard_secs: float, rounds: int) -> dict:
    data = work / f"input-{size}.jsonl"
    if not data.exists():
        generate(data, size * int(MB))
    results = []
    for round_ in range(rounds):
        print(f"== stream, {shards} shards, {size} MB, {shard_secs} s a shard, round {round_ + 1}; {uptime()}")
        job, export, plain = work / "job-stream", work / "streamed.jsonl", work / "plain.jsonl"
        for path in work.glob("streamed*"):
            path.unlink()
        settings = ElasticSettings(job_dir=str(job), poll_interval_secs=0.2, lease_ttl_secs=600)
        follower = StreamFollower(job, str(export), settings)
        try:
            build(data, job, shards, shard_secs, during=follower)
            t0 = time.perf_counter()
            streamed = finalize(job, export, stream=True, lock_wait_secs=600)
            stream_secs = time.perf_counter() - t0
        finally:
            follower.stop()
        shard, shard_run = last_shard_secs(job)
        os.sync()
        t0 = time.perf_counter()
        full = finalize(job, plain, stream=False)
        full_secs = time.perf_counter() - t0
        assert export.read_bytes() == plain.read_bytes() and streamed.sha256 == full.sha256
        row = {
            "finalize_streamed_s": stream_secs,
            "last_shard": shard,
            "last_shard_run_s": shard_run,
            "finalize_full_merge_s": full_secs,
            "streamed_over_last_shard": stream_secs / shard_run,
            "streamed_over_full": stream_secs / full_secs,
        }
        print("   " + json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        results.append(row)
        for path in (plain, work / "plain_stats.jsonl"):
            path.unlink(missing_ok=True)
    keys = ("finalize_streamed_s", "last_shard_run_s", "finalize_full_merge_s", "streamed_over_last_shard")
    return {"rounds": results, "median": {k: statistics.median(r[k] for r in results) for k in keys}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--sizes-mb", default="100,1000", help="total shard output sizes for the parts section")
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stream-mb", type=int, default=1000)
    parser.add_argument("--stream-shards", type=int, default=16)
    parser.add_argument("--shard-secs", type=float, default=3.0, help="each shard's run time in the stream section")
    parser.add_argument("--stream-rounds", type=int, default=2)
    parser.add_argument("--sections", default="parts,stream")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import pandas  # noqa: F401  (finalize's overall.csv; a real run overlaps this import with the merge)
    from loguru import logger

    logger.remove()  # the benchmark's own lines only
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    sections = args.sections.split(",")
    if "parts" in sections:
        sizes = [int(s) for s in args.sizes_mb.split(",")]
        results["parts"] = parts_section(args.workdir, sizes, args.shards, args.repeat)
        print("parts ratios:", json.dumps({k: round(v, 3) for k, v in results["parts"]["ratios"].items()}))
    if "stream" in sections:
        results["stream"] = stream_section(
            args.workdir, args.stream_mb, args.stream_shards, args.shard_secs, args.stream_rounds
        )
        print("stream medians:", json.dumps({k: round(v, 3) for k, v in results["stream"]["median"].items()}))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
