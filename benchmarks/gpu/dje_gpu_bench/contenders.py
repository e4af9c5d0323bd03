"""The contenders, each run over the same outer batches of one corpus, on a real or a simulated encoder.

A contender is ``run(encoder, outer_batches, clock, sleep) -> Outcome``; the
encoder does the work (``embed``, ``token_counts``) and raises a CUDA OOM (real,
or torch's ``OutOfMemoryError`` from the simulation) when a call does not fit.

* ``fixed-N-skip`` / ``fixed-N-raise``: Data-Juicer without adaptive batching:
  the outer batch *is* the batch (``batch_size: N``); with ``skip_op_error``
  (Data-Juicer's default) an OOM drops the batch and the job reports success,
  without it the job fails at the first OOM;
* ``fixed-best``: the largest size of :data:`FIXED_SEARCH` that runs the corpus
  without an OOM, found the way a person would (largest first, a try stops at its
  first OOM), then timed on its own;
* ``data-juicer-1.6.1``: Data-Juicer's own controller through its Ray actor class
  ``RayAdaptiveMapperActor`` (the class itself, in this process: the same
  controller arguments, slicing, OOM cleanup and skip policy as in a Ray actor);
* ``ours-*``: the recipe opt-in (``adaptive_batching: true``) of the benchmark
  operator, with the operator's cost model (``ours-default``: none set);
  ``-unsorted``: with ``adaptive_batching_sort`` off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dje_gpu_bench.op import NAME

FIXED_SEARCH = (512, 384, 256, 192, 160, 128, 112, 96, 80, 64, 48, 32, 24, 16, 8, 4, 2, 1)
# "-unsorted": the cost model with adaptive_batching_sort off (as every cost model ran before sorting was the default)
OURS = (
    "default",
    "rows",
    "text",
    "padded_text",
    "tokens",
    "padded_tokens",
    "text-unsorted",
    "padded_text-unsorted",
    "tokens-unsorted",
)


@dataclass
class Outcome:
    name: str
    rows_in: int = 0
    ids: list[int] = field(default_factory=list)  # row ids delivered, in delivery order
    embeddings: list[Any] = field(default_factory=list)
    secs: float = 0.0
    ooms: int = 0
    retries: int = 0
    calls: int = 0
    sizes: list[int] = field(default_factory=list)  # rows of each successful call
    failed: str | None = None  # the job failed (and why)
    note: str = ""

    @property
    def rows_out(self) -> int:
        return len(self.ids)


def _op(**kwargs: Any):
    from data_juicer.ops.base_op import OPERATORS

    return OPERATORS.modules[NAME](**kwargs)


def _is_oom(exc: BaseException) -> bool:
    from data_juicer_elastic.batching.policy import classify_oom

    return classify_oom(exc) is not None


def run_fixed(size: int, skip: bool, encoder, rows: list[dict], clock, sleep, *, stop_at_oom: bool = False) -> Outcome:
    out = Outcome(f"fixed-{size}-{'skip' if skip else 'raise'}", rows_in=len(rows))
    op = _op(batch_size=size, skip_op_error=skip).attach(encoder)
    encoder.reset_counters()
    start = clock()
    for begin in range(0, len(rows), size):
        piece = rows[begin : begin + size]
        batch = {"id": [r["id"] for r in piece], "text": [r["text"] for r in piece]}
        try:
            result = op.process_batched(batch)  # what Mapper.process runs, minus the skip wrapper below
        except Exception as exc:
            if not _is_oom(exc):
                raise
            if not skip or stop_at_oom:
                out.failed = f"OOM at rows {begin}..{begin + len(piece) - 1}"
                break
            continue  # Data-Juicer's skip_op_error: the batch is dropped, the job goes on
        out.ids.extend(result["id"])
        out.embeddings.extend(result["embedding"])
    out.secs = clock() - start
    return _counted(out, encoder)


def _counted(out: Outcome, encoder) -> Outcome:
    out.sizes, out.ooms = list(encoder.sizes), encoder.ooms
    out.calls = len(out.sizes) + out.ooms
    out.retries = out.retries or (out.ooms if out.name.startswith(("data-juicer", "ours")) else 0)
    return out


def search_fixed(encoder, rows: list[dict], clock, sleep) -> tuple[int, list[str]]:
    """The largest size of FIXED_SEARCH without an OOM over ``rows`` (tries stop at their first OOM)."""
    log = []
    for size in FIXED_SEARCH:
        trial = run_fixed(size, False, encoder, rows, clock, sleep, stop_at_oom=True)
        log.append(f"{size}: {'OOM after ' + str(trial.rows_out) + ' rows' if trial.failed else 'no OOM'}")
        if not trial.failed:
            return size, log
    return FIXED_SEARCH[-1], log


def run_data_juicer(encoder, outer: list[list[dict]], clock, sleep, batch_size: int) -> Outcome:
    from data_juicer.core.elasticjuicer import adaptive_mapper
    from data_juicer.core.elasticjuicer.ray_adaptive_mapper import RayAdaptiveMapperActor

    virtual_sleep = sleep

    class _Time:  # its floor waits call time.sleep: the simulation's clock advances instead
        sleep = staticmethod(virtual_sleep)

    adaptive_mapper.time = _Time
    out = Outcome("data-juicer-1.6.1", rows_in=sum(map(len, outer)))
    from dje_gpu_bench.op import BenchEmbedMapper

    actor = RayAdaptiveMapperActor(BenchEmbedMapper, (), {"batch_size": batch_size}, batch_size)
    actor.op.attach(encoder)
    encoder.reset_counters()
    start = clock()
    try:
        for rows in outer:
            result = actor({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]})
            out.ids.extend(result["id"])
            out.embeddings.extend(result["embedding"])
    except Exception as exc:
        out.failed = f"{type(exc).__name__}: {str(exc)[:120]}"
    finally:
        adaptive_mapper.time = time
    out.secs = clock() - start
    return _counted(out, encoder)


def run_ours(
    cost: str,
    encoder,
    outer: list[list[dict]],
    clock,
    sleep,
    batch_size: int,
    engine: dict | None = None,
) -> Outcome:
    """The opt-in.  ``engine``: MicroBatcher arguments for a virtual clock (the simulation); None: the
    real path, ``op.process`` with the process-wide controller state, as in a worker."""
    from data_juicer_elastic.batching import BatchPolicy, runtime
    from data_juicer_elastic.batching.engine import BatchStats

    runtime.reset()
    model, _, unsorted = cost.partition("-")
    sort = False if unsorted else None
    op = _op(batch_size=batch_size, adaptive_batching=True, cost_model=None if model == "default" else model, sort=sort)
    op.attach(encoder)
    out = Outcome(f"ours-{cost}", rows_in=sum(map(len, outer)))
    stats = BatchStats()
    policy = BatchPolicy(batch_size, op.adaptive_batching_policy, clock=clock)
    encoder.reset_counters()
    start = clock()
    try:
        for rows in outer:
            batch = {"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}
            if engine is None:
                result = op.process(batch)
            else:
                result = op.adaptive_batcher(batch, op.process_batched, policy, stats=stats, **engine)(batch)
            out.ids.extend(result["id"])
            out.embeddings.extend(result["embedding"])
    except Exception as exc:
        out.failed = f"{type(exc).__name__}: {str(exc)[:120]}"
    out.secs = clock() - start
    if engine is None:
        ((mode, summary),) = op.adaptive_batching_stats().items()
    else:
        mode, summary = op.adaptive_cost_mode(batch)[0], stats.to_json()
    out.retries = summary["retries"]
    out.note = f"cost model {mode}, sorted outer batches {summary['sorted_batches']}"
    return _counted(out, encoder)
