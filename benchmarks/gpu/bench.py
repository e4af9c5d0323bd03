"""Adaptive batching on a real GPU: Data-Juicer's fixed sizes and built-in controller vs this project's opt-in.

    python benchmarks/gpu/bench.py --json $OUT/gpu.json                # on a CUDA machine (a few minutes)
    python benchmarks/gpu/bench.py --cpu-dry-run                       # CI smoke: tiny model, forced OOMs

What it runs (``dje_gpu_bench``): a bert-base-sized encoder with random weights
in fp16 and eager attention (``model.EncoderSpec``), a WordPiece tokenizer built
in code, 13,824 generated texts with long-tailed lengths (``corpus``), outer
batches of 512, and this process's CUDA allocator capped (``--cap-gib``,
weights included) so real OOMs happen at realistic sizes.  Every contender of
``contenders`` runs over the same rows; every delivered row's embedding is
compared with a reference computed 8 rows at a time before the cap; rows/s,
OOMs, retries, micro-batch sizes, peak allocated memory, the encoder's busy
fraction and (with ``nvidia-smi``) the GPU's mean utilisation are reported.

``--sharded``: the same operator in an 8-shard ``elastic_sharded`` job
(``dj-process``, local Ray, ``adaptive_batching: true``, one GPU): job time,
rows out, and the GPU busy fraction sampled over the job.

``--cpu-dry-run``: the tiny encoder on CPU; OOMs are forced by the simulated
device's memory formula (``--forced-oom-mib``) so every path runs (OOM, retry,
shrink, skip, job failure, the search), with 512 rows (128-token texts, outer batches of 128) and 2 shards.  Exit 1
when an ``ours-*`` contender lost, duplicated, reordered or changed a row, or
the sharded job did not return every row.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), str(REPO), os.environ.get("PYTHONPATH")]))

from dje_gpu_bench import contenders as c  # noqa: E402
from dje_gpu_bench import corpus, report  # noqa: E402
from dje_gpu_bench.model import Encoder, EncoderSpec, cap_memory  # noqa: E402


class GpuSampler:
    """Mean GPU utilisation and the share of samples with the GPU busy, from ``nvidia-smi`` every 100 ms."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        smi = shutil.which("nvidia-smi")
        if smi:
            cmd = [smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100", "-i", "0"]
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                self.samples.append(float(line.strip()))
            except ValueError:
                pass

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=5)

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        busy = sum(s > 0 for s in self.samples) / len(self.samples)
        return {"mean_util": sum(self.samples) / len(self.samples) / 100, "busy": busy, "samples": len(self.samples)}


def controllers(args, encoder, rows: list[dict]) -> list[dict]:
    outer = [rows[i : i + args.outer] for i in range(0, len(rows), args.outer)]
    torch = encoder.torch
    cuda = encoder.device.type == "cuda"
    names = args.contenders
    clock, sleep = time.perf_counter, time.sleep
    plan: list[tuple[str, object]] = [
        (f"fixed-{args.outer}-skip", lambda: c.run_fixed(args.outer, True, encoder, rows, clock, sleep)),
        (f"fixed-{args.outer}-raise", lambda: c.run_fixed(args.outer, False, encoder, rows, clock, sleep)),
        ("fixed-best", lambda: best_fixed(encoder, rows)),
        ("data-juicer-1.6.1", lambda: c.run_data_juicer(encoder, outer, clock, sleep, args.outer)),
    ] + [
        (f"ours-{cost}", lambda cost=cost: c.run_ours(cost, encoder, outer, clock, sleep, args.outer))
        for cost in c.OURS
    ]
    results = []
    for name, run in plan:
        if names and name not in names:
            continue
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        with GpuSampler() as gpu:
            outcome = run()
        result = report.summarize(outcome, encoder, args.reference)
        result["peak"] = torch.cuda.max_memory_allocated() if cuda else 0.0
        result["gpu"] = gpu.summary()
        results.append(result)
        print(f"  {name}: {result['rows_out']}/{result['rows_in']} rows in {result['secs']:.1f}s", flush=True)
    return results


def best_fixed(encoder, rows: list[dict]):
    size, log = c.search_fixed(encoder, rows, time.perf_counter, time.sleep)
    best = c.run_fixed(size, False, encoder, rows, time.perf_counter, time.sleep)
    best.name, best.note = (
        f"fixed-best ({size})",
        "searched largest first, a try stops at its first OOM: " + "; ".join(log),
    )
    return best


def sharded(args, spec: EncoderSpec, texts: list[str], work: Path) -> dict:
    """An ``elastic_sharded`` job of the operator over the corpus; the GPU sampled over the whole job."""
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    data = work / "corpus.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    op = {"batch_size": args.outer, "adaptive_batching": True, "encoder": replace(spec, output_dims=16).to_dict()}
    if spec.device == "cuda":
        op |= {"num_gpus": 1, "accelerator": "cuda"}
    recipe = {
        "project_name": "gpu-bench",
        "executor_type": "elastic_sharded",
        "dataset_path": str(data),
        "export_path": str(work / "out" / "merged.jsonl"),
        "np": 1,
        "custom_operator_paths": [str(HERE / "dje_gpu_bench")],
        "elastic": {
            "job_dir": str(work / "job"),
            "num_shards": args.shards,
            "ray_address": "local",
            "overwrite_output": True,
        },
        "process": [{"elastic_bench_embed_mapper": op}],
    }
    path = work / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    cmd = [sys.executable, "-c", "from data_juicer.tools.process_data import main; main()", "--config", str(path)]
    log = work / "dj-process.log"
    start = time.perf_counter()
    with GpuSampler() as gpu, open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    secs = time.perf_counter() - start
    merged = work / "out" / "merged.jsonl"
    ids = [json.loads(line)["id"] for line in merged.open()] if merged.exists() else []
    return {
        "shards": args.shards,
        "exit": proc.returncode,
        "secs": secs,
        "rows_in": len(texts),
        "rows_out": len(ids),
        "in_order": ids == sorted(ids),
        "gpu": gpu.summary(),
        "log": str(log),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny model on CPU with forced OOMs (CI)")
    parser.add_argument("--rows", type=int, help="texts (default 13,824; dry run 512)")
    parser.add_argument("--outer", type=int, help="outer batch = batch_size = micro-batch ceiling (512; dry run 128)")
    parser.add_argument("--cap-gib", type=float, default=1.47, help="CUDA allocator cap, weights included")
    parser.add_argument("--attention", default="eager", choices=("eager", "sdpa"))
    parser.add_argument("--forced-oom-mib", type=float, default=24.0, help="dry run: simulated activation room")
    parser.add_argument("--contenders", nargs="*", help="names to run (default: all)")
    parser.add_argument("--sharded", action="store_true", help="also the elastic_sharded job (default in dry run)")
    parser.add_argument("--no-sharded", action="store_true")
    parser.add_argument("--only-sharded", action="store_true")
    parser.add_argument("--shards", type=int, help="default 8; dry run 2")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-gpu-bench"))
    parser.add_argument("--json", type=Path, help="write every number here")
    args = parser.parse_args(argv)
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")  # per-OOM INFO lines are not the result
    dry = args.cpu_dry_run
    args.rows = args.rows or (512 if dry else corpus.CorpusSpec.rows)
    args.outer = args.outer or (128 if dry else 512)
    args.shards = args.shards or (2 if dry else 8)
    run_sharded = (args.sharded or dry or args.only_sharded) and not args.no_sharded
    if dry:
        import torch

        torch.set_num_threads(1)  # a tiny model: threads only contend on a small shared CPU
        spec = EncoderSpec.tiny(attention=args.attention, forced_oom_mib=args.forced_oom_mib, max_length=128)
    else:
        import torch

        if not torch.cuda.is_available():
            print("bench.py: no CUDA device; use --cpu-dry-run on a machine without a GPU", file=sys.stderr)
            return 2
        spec = EncoderSpec(attention=args.attention)
    texts = corpus.texts(corpus.CorpusSpec(rows=args.rows))
    rows = [{"id": i, "text": t} for i, t in enumerate(texts)]
    result: dict = {"spec": spec.to_dict(), "rows": args.rows, "outer": args.outer, "dry_run": dry}
    ok = True
    if not args.only_sharded:
        started = time.perf_counter()
        encoder = Encoder(spec)
        result["encoder_build_secs"] = time.perf_counter() - started
        forced, encoder.forced = encoder.forced, None  # the reference never runs out of memory
        embedded = [e for i in range(0, len(texts), 8) for e in encoder.embed(texts[i : i + 8])]
        encoder.forced = forced
        args.reference = dict(enumerate(embedded))
        if encoder.device.type == "cuda":
            result["cap_fraction"] = cap_memory(args.cap_gib, encoder.device)
            result["device"] = encoder.torch.cuda.get_device_name(0)
        print(f"encoder ready ({result['encoder_build_secs']:.1f}s); {args.rows} rows; contenders:", flush=True)
        results = controllers(args, encoder, rows)
        result["contenders"] = results
        ok = report.print_table(results, peak_unit="MiB")
        for r in results:
            if r["gpu"]:
                print(f"- {r['name']}: GPU mean utilisation {r['gpu']['mean_util']:.0%}, busy {r['gpu']['busy']:.0%}")
    if run_sharded:
        shard_spec = replace(spec, cap_gib=args.cap_gib if spec.device == "cuda" else None)
        job = sharded(args, shard_spec, texts, args.workdir / "sharded")
        result["sharded"] = job
        gpu = job["gpu"]
        print(
            f"\nelastic_sharded, {job['shards']} shards: exit {job['exit']}, {job['rows_out']}/{job['rows_in']} rows "
            f"in {job['secs']:.1f}s ({job['rows_out'] / job['secs']:.0f} rows/s), in order: {job['in_order']}, GPU "
            + (f"busy {gpu['busy']:.0%} (mean utilisation {gpu['mean_util']:.0%})" if gpu else "not sampled (no GPU)")
        )
        ok &= job["exit"] == 0 and job["rows_out"] == job["rows_in"] and job["in_order"]
        if job["exit"]:
            print(f"sharded job failed; see {job['log']}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        for r in result.get("contenders", []):
            r["sizes"] = {"min": min(r["sizes"]), "max": max(r["sizes"]), "n": len(r["sizes"])}
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
