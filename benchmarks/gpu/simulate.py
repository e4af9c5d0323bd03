"""The real-GPU benchmark's contenders on a simulated, H200-calibrated device (virtual clock, seconds).

    python benchmarks/gpu/simulate.py                        # 13,824 rows, outer batches of 512
    python benchmarks/gpu/simulate.py --seeds 3 --only data-juicer-1.6.1 ours-default ours-rows

Same corpus, operator, contenders and checks as ``bench.py``; the encoder is
:class:`dje_gpu_bench.simdevice.SimEncoder` (memory ~ rows x L + rows x L^2,
allocator cache flushes, OOM cost), so a run is deterministic and the numbers
are *predictions* for the GPU run, not measurements.  ``--calibration k=v ...``
changes the device's constants (see ``simdevice.Calibration``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

from dje_gpu_bench import corpus, report  # noqa: E402
from dje_gpu_bench.model import EncoderSpec, build_tokenizer  # noqa: E402  (tokenizers only, no torch)
from dje_gpu_bench.simdevice import Calibration, SimEncoder  # noqa: E402


def run(spec: corpus.CorpusSpec, calibration: Calibration, names: list[str] | None, outer_size: int = 512):
    from dje_gpu_bench import contenders as c

    texts = corpus.texts(spec)
    rows = [{"id": i, "text": t} for i, t in enumerate(texts)]
    outer = [rows[i : i + outer_size] for i in range(0, len(rows), outer_size)]
    counter = build_tokenizer(EncoderSpec(vocab_seed=spec.seed, max_length=spec.max_length), padding=False)
    counts = {t: len(e.ids) for t, e in zip(texts, counter.encode_batch(texts), strict=True)}
    reference = {r["id"]: e for r, e in zip(rows, SimEncoder(calibration, counts).embed_rows(texts), strict=True)}
    results = []

    def device() -> SimEncoder:
        return SimEncoder(calibration, counts, spec.seed)

    def want(name: str) -> bool:
        return names is None or name in names

    for skip in (True, False):
        if want(f"fixed-{outer_size}-{'skip' if skip else 'raise'}"):
            enc = device()
            results.append((c.run_fixed(outer_size, skip, enc, rows, enc.now, enc.sleep), enc))
    if want("fixed-best"):
        enc = device()
        size, log = c.search_fixed(enc, rows, enc.now, enc.sleep)
        enc = device()
        best = c.run_fixed(size, False, enc, rows, enc.now, enc.sleep)
        best.name, best.note = f"fixed-best ({size})", "searched: " + ", ".join(log)
        results.append((best, enc))
    if want("data-juicer-1.6.1"):
        enc = device()
        results.append((c.run_data_juicer(enc, outer, enc.now, enc.sleep, outer_size), enc))
    for cost in c.OURS:
        if want(f"ours-{cost}"):
            enc = device()
            engine = {"cleanup": lambda: None, "sleep": enc.sleep}
            results.append((c.run_ours(cost, enc, outer, enc.now, enc.sleep, outer_size, engine), enc))
    return [
        report.summarize(outcome, enc, reference, capacity=calibration.capacity_mib * 2**20) for outcome, enc in results
    ]


# Measured on an H200 (docs/adaptive-batching.md): rows/s of each contender / Data-Juicer 1.6.1's controller, with the
# cost models as they were then (default = "text", before sorting).  --fit looks for calibrations whose
# simulation reproduces this order (the fit is a search, not a derivation: report what it finds).
MEASURED = {
    "ours-rows": 1.20,
    "ours-padded_text-unsorted": 0.95,
    "ours-tokens-unsorted": 0.90,
    "ours-text-unsorted": 0.76,  # the default then
}
FIT_GRID = {
    "capacity_mib": (700.0, 1000.0, 1500.0, 2000.0),
    "oom_ms": (60.0, 200.0),
    "frag": (0.1, 0.4),
    "call_ms": (6.0, 20.0),
}


def fit(spec: corpus.CorpusSpec) -> None:
    import itertools

    names = ["data-juicer-1.6.1", *MEASURED]
    print("| " + " | ".join(FIT_GRID) + " | " + " | ".join(MEASURED) + " | order holds | distance |")
    print("|" + "---:|" * (len(FIT_GRID) + len(MEASURED) + 2))
    for values in itertools.product(*FIT_GRID.values()):
        calibration = replace(Calibration(), **dict(zip(FIT_GRID, values, strict=True)))
        rates = {r["name"]: r["rows_out"] / r["secs"] for r in run(spec, calibration, names)}
        ratios = {name: rates[name] / rates["data-juicer-1.6.1"] for name in MEASURED}
        order = ratios["ours-rows"] > 1 > ratios["ours-padded_text-unsorted"] > ratios["ours-text-unsorted"]
        distance = sum((ratios[n] - MEASURED[n]) ** 2 for n in MEASURED) ** 0.5
        cells = " | ".join(f"{v:g}" for v in values) + " | " + " | ".join(f"{ratios[n]:.2f}" for n in MEASURED)
        print(f"| {cells} | {'yes' if order else 'no'} | {distance:.2f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=corpus.CorpusSpec.rows)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--only", nargs="*", help="contender names (default: all)")
    parser.add_argument("--calibration", nargs="*", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--fit", action="store_true", help="search FIT_GRID for the measured H200 order")
    args = parser.parse_args(argv)
    from loguru import logger

    logger.remove()  # per-OOM log lines are not the result
    changes = {}
    for item in args.calibration:
        key, _, value = item.partition("=")
        if key not in {f.name for f in fields(Calibration)}:
            parser.error(f"unknown calibration field {key!r}")
        changes[key] = float(value)
    calibration = replace(Calibration(), **changes)
    if args.fit:
        fit(corpus.CorpusSpec(rows=args.rows))
        return 0
    print(f"calibration: {calibration}\nrows={args.rows} seeds={args.seeds}\n")
    started = time.perf_counter()
    per_seed = [run(corpus.CorpusSpec(rows=args.rows, seed=s), calibration, args.only) for s in range(args.seeds)]
    ok = report.print_table(report.pool(per_seed))
    print(f"\n({time.perf_counter() - started:.1f}s wall, pid {os.getpid()})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
