"""Side-by-side CPU benchmark of micro-batch controllers on a simulated GPU mapper (virtual clock).

    python benchmarks/adaptive_batching.py                 # 3 seeds x 60k rows, all scenarios
    python benchmarks/adaptive_batching.py --rows 20000 --seeds 1 --scenarios stationary sorted

Every controller sees the same rows, costs and faults (all randomness is keyed
by seed and row or call index), on a virtual clock, so runs are deterministic
and take seconds.  The simulated mapper:

* row lengths lognormal (median 300, sigma 0.9, clipped to [8, 8192]) plus 0.5%
  giants of 6,000-8,192; memory of a micro-batch = sum of lengths (``--memory
  padded``: n x max length; ``padded2``: n x max length^2 / 2000); capacity 40,000;
* outer batch 512 rows; a call takes 15 ms + 1 us per memory unit; an OOM
  wastes U(0.3, 1) x the call time plus 30 ms cleanup, and raises torch's
  ``OutOfMemoryError`` (a classified RuntimeError stand-in without torch).

Scenarios: ``stationary``; ``step`` (capacity x0.6 from 30% to 70% of the rows); ``sine``
(capacity +-20%, three periods); ``spikes`` (1% of calls at half capacity); ``fragmentation``
(capacity falls 0.2% per call until an OOM's cleanup, floor 50%); ``sorted`` (lengths
ascending); ``poison`` (one row costs more than the whole capacity); ``errors`` (0.1% of
rows raise a non-OOM error, with ``skip_op_error``).

Controllers: fixed sizes; accelerate-style ``find_executable_batch_size`` (x0.5
and x0.9: the whole outer batch restarts smaller, never grows); Lightning-style
tune-then-fix; AIMD (+1 row, x0.5, same-offset retry); Data-Juicer 1.6.1's
built-in controller, imported from the installed package and driven exactly as
its Ray actor drives it; and ours (data_juicer_elastic.batching), with the
cost model matching the memory variant (``ours``) and cost-blind (``ours-rows``).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_juicer_elastic.batching.engine import MicroBatcher  # noqa: E402
from data_juicer_elastic.batching.oom import classify_oom  # noqa: E402
from data_juicer_elastic.batching.policy import BatchPolicy  # noqa: E402
from data_juicer_elastic.errors import MicroBatchOOMError  # noqa: E402

CAPACITY = 40_000.0
OUTER = 512
CALL_SECS, UNIT_SECS, CLEANUP_SECS = 0.015, 1e-6, 0.030
SCENARIOS = ("stationary", "step", "sine", "spikes", "fragmentation", "sorted", "poison", "errors")

try:
    import torch

    def make_oom(msg: str) -> Exception:
        return torch.OutOfMemoryError(msg)
except ImportError:  # pragma: no cover - torch is an optional extra

    def make_oom(msg: str) -> Exception:
        return RuntimeError(f"CUDA out of memory (simulated): {msg}")


class BadRow(ValueError):
    """A deterministic non-OOM operator error (the `errors` scenario)."""


def _u(*key) -> float:
    """A uniform [0, 1) value keyed by ``key``: the same for every controller."""
    return random.Random(hash(key) & 0xFFFFFFFF).random()


@dataclass
class World:
    """The simulated device: rows, memory model, capacity schedule, virtual clock."""

    scenario: str
    seed: int
    lengths: list[float]
    memory: str = "sum"
    clock: float = 0.0
    calls: int = 0
    since_cleanup: int = 0
    wasted: float = 0.0
    ooms: int = 0
    outer_index: int = 0
    bad: frozenset = frozenset()
    slice_ooms: int = 0
    max_slice_ooms: int = 0
    recover: dict = field(default_factory=dict)

    @property
    def progress(self) -> float:
        return self.outer_index * OUTER / len(self.lengths)

    def capacity(self) -> float:
        c, p = CAPACITY, self.progress
        if self.scenario == "step" and 0.3 <= p < 0.7:
            c *= 0.6
        elif self.scenario == "sine":
            c *= 1 + 0.2 * math.sin(2 * math.pi * 3 * p)
        elif self.scenario == "spikes" and _u(self.seed, "spike", self.calls) < 0.01:
            c *= 0.5
        elif self.scenario == "fragmentation":
            c *= max(0.5, 1 - 0.002 * self.since_cleanup)
        return c

    def cost(self, ids: list[int]) -> float:
        lens = [self.lengths[i] for i in ids]
        if self.memory == "sum":
            return sum(lens)
        if self.memory == "padded":
            return len(lens) * max(lens)
        return len(lens) * max(lens) ** 2 / 2000

    def call(self, piece: dict) -> dict:
        ids = piece["id"]
        self.calls += 1
        cost = self.cost(ids)
        secs = CALL_SECS + UNIT_SECS * cost
        if cost > self.capacity():
            waste = (0.3 + 0.7 * _u(self.seed, "waste", self.calls)) * secs + CLEANUP_SECS
            self.clock += waste
            self.wasted += waste
            self.ooms += 1
            self.since_cleanup = 0
            self.slice_ooms += 1
            self.max_slice_ooms = max(self.max_slice_ooms, self.slice_ooms)
            self._track_recovery(ok=False)
            raise make_oom(f"tried to allocate {cost:.0f} units with {self.capacity():.0f} free")
        self.clock += secs
        self.since_cleanup += 1
        self.slice_ooms = 0
        self._track_recovery(ok=True)
        if self.bad and any(i in self.bad for i in ids):
            raise BadRow(f"bad row in {ids[0]}..{ids[-1]}")
        return {"id": list(ids), "out": [i * 2 + int(self.lengths[i]) for i in ids]}

    def sleep(self, secs: float) -> None:
        self.clock += secs
        self.wasted += secs

    def _track_recovery(self, ok: bool) -> None:
        # calls from the step-down until 10 consecutive successes
        if self.scenario != "step" or self.progress < 0.3 or self.recover.get("done"):
            return
        self.recover["calls"] = self.recover.get("calls", 0) + 1
        self.recover["streak"] = self.recover.get("streak", 0) + 1 if ok else 0
        if self.recover["streak"] >= 10:
            self.recover["done"] = True


def make_world(scenario: str, seed: int, rows: int, memory: str) -> World:
    rng = random.Random(seed)
    lengths = []
    for _ in range(rows):
        if rng.random() < 0.005:
            lengths.append(float(rng.randint(6000, 8192)))
        else:
            lengths.append(float(min(8192, max(8, round(rng.lognormvariate(math.log(300), 0.9))))))
    if scenario == "sorted":
        lengths.sort()
    bad: frozenset = frozenset()
    if scenario == "poison":
        lengths[rows // 2] = 10 * CAPACITY if memory == "sum" else 4 * CAPACITY
    if scenario == "errors":
        bad = frozenset(i for i in range(rows) if _u(seed, "bad", i) < 0.001)
    return World(scenario, seed, lengths, memory, bad=bad)


# -- controllers: run(world, outer_batch) -> output dict or raise --------------------------------------


class Lost(Exception):
    """The controller gave up on this outer batch (terminal failure) or skipped it (reported)."""

    def __init__(self, rows: int, terminal: bool):
        super().__init__(rows)
        self.rows, self.terminal = rows, terminal


def _is_oom(exc: BaseException) -> bool:
    return classify_oom(exc) is not None


def _concat(outs: list[dict]) -> dict:
    return {"id": [i for o in outs for i in o["id"]], "out": [v for o in outs for v in o["out"]]}


class Fixed:
    def __init__(self, size: int):
        self.size, self.name = size, f"fixed-{size}"

    def __call__(self, world: World, batch: dict) -> dict:
        ids, outs = batch["id"], []
        for start in range(0, len(ids), self.size):
            try:
                outs.append(world.call({"id": ids[start : start + self.size]}))
            except Exception as exc:
                raise Lost(len(ids), terminal=_is_oom(exc)) from None
        return _concat(outs)


class Accelerate:
    """find_executable_batch_size: on OOM the whole function restarts at size x factor; never grows."""

    def __init__(self, factor: float):
        self.factor, self.size, self.name = factor, OUTER, f"accelerate-x{factor}"

    def __call__(self, world: World, batch: dict) -> dict:
        ids = batch["id"]
        while self.size > 0:
            try:
                return _concat([world.call({"id": ids[s : s + self.size]}) for s in range(0, len(ids), self.size)])
            except Exception as exc:
                if not _is_oom(exc):
                    raise Lost(len(ids), terminal=False) from None
                self.size = int(self.size * self.factor)
        self.size = 1  # accelerate raises "No executable batch size found"; the next batch starts again at 1
        raise Lost(len(ids), terminal=True)


class Lightning:
    """Tune once on the first batch (x2 until OOM, then bisect), then run fixed; an OOM later is fatal."""

    name = "lightning-tune"

    def __init__(self):
        self.size: int | None = None

    def __call__(self, world: World, batch: dict) -> dict:
        ids = batch["id"]
        if self.size is None:
            lo, hi, n = 0, None, 1
            while n <= len(ids) and (hi is None or hi - lo > 1):
                try:
                    world.call({"id": ids[:n]})
                    lo = n
                    n = n * 2 if hi is None else (lo + hi) // 2
                except Exception:
                    hi = n
                    n = (lo + hi) // 2
                if n <= lo:
                    break
            self.size = max(1, lo)
        return Fixed(self.size)(world, batch)


class Aimd:
    """Additive increase (+1 row per success), multiplicative decrease (x0.5), same-offset retry."""

    name = "aimd"

    def __init__(self):
        self.size = OUTER

    def __call__(self, world: World, batch: dict) -> dict:
        ids, outs, offset = batch["id"], [], 0
        while offset < len(ids):
            for _ in range(17):
                n = min(self.size, len(ids) - offset)
                try:
                    outs.append(world.call({"id": ids[offset : offset + n]}))
                    offset += n
                    self.size = min(OUTER, self.size + 1)
                    break
                except Exception as exc:
                    if not _is_oom(exc) or n == 1:
                        raise Lost(len(ids), terminal=_is_oom(exc)) from None
                    self.size = max(1, n // 2)
            else:
                raise Lost(len(ids), terminal=True)
        return _concat(outs)


class DataJuicer:
    """Data-Juicer 1.6.1's controller + OOMSafeAdaptiveMapper, configured as RayAdaptiveMapperActor does."""

    name = "data-juicer-1.6.1"

    def __init__(self, world: World):
        from data_juicer.core.elasticjuicer import adaptive_mapper
        from data_juicer.core.elasticjuicer.adaptive_mapper import OOMSafeAdaptiveMapper
        from data_juicer.core.elasticjuicer.batch_controller import AdaptiveBatchController

        class _Time:  # its floor waits call time.sleep: advance the virtual clock instead
            sleep = staticmethod(world.sleep)

        adaptive_mapper.time = _Time
        controller = AdaptiveBatchController(
            initial_batch_size=OUTER,
            max_batch_size=OUTER,
            max_oom_reprobes=4,
            minimum_growth_fraction=0.25,
            clock_ms=lambda: int(world.clock * 1000),
        )
        self.mapper = OOMSafeAdaptiveMapper(world.call, controller, oom_cleanup=lambda: None, label="bench")

    def __call__(self, world: World, batch: dict) -> dict:
        try:
            return self.mapper(batch)
        except Exception as exc:  # its actor drops the whole outer batch on other errors (skip_op_error)
            raise Lost(len(batch["id"]), terminal=_is_oom(exc)) from None


class Ours:
    def __init__(self, world: World, cost_blind: bool = False):
        self.name = "ours-rows" if cost_blind else "ours"
        lengths = world.lengths
        if cost_blind:
            row_costs, aggregate = None, "sum"
        elif world.memory == "sum":
            row_costs, aggregate = (lambda b: [lengths[i] for i in b["id"]]), "sum"
        elif world.memory == "padded":
            row_costs, aggregate = (lambda b: [lengths[i] for i in b["id"]]), "padded"
        else:
            row_costs, aggregate = (lambda b: [lengths[i] ** 2 / 2000 for i in b["id"]]), "padded"
        policy = BatchPolicy(OUTER, clock=lambda: world.clock)
        self.batcher = MicroBatcher(
            world.call,
            policy,
            label="bench",
            row_costs=row_costs,
            aggregate=aggregate,
            skip_errors=world.scenario == "errors",
            cleanup=lambda: None,
            sleep=world.sleep,
        )

    def __call__(self, world: World, batch: dict) -> dict:
        before = self.batcher.stats.skipped_rows
        try:
            out = self.batcher(batch)
        except MicroBatchOOMError:
            raise Lost(len(batch["id"]), terminal=True) from None
        self.reported_skips = self.batcher.stats.skipped_rows - before
        return out


FACTORIES: dict[str, Callable[[World], Callable]] = {
    "fixed-32": lambda w: Fixed(32),
    "fixed-64": lambda w: Fixed(64),
    "accelerate-x0.5": lambda w: Accelerate(0.5),
    "accelerate-x0.9": lambda w: Accelerate(0.9),
    "lightning-tune": lambda w: Lightning(),
    "aimd": lambda w: Aimd(),
    "data-juicer-1.6.1": DataJuicer,
    "ours-rows": lambda w: Ours(w, cost_blind=True),
    "ours": Ours,
}


@dataclass
class Result:
    rows_out: int = 0
    secs: float = 0.0
    wasted: float = 0.0
    ooms: int = 0
    max_slice_ooms: int = 0
    skipped: int = 0  # rows dropped on reported non-OOM errors (skip_op_error)
    failed_rows: int = 0  # rows of outer batches that failed terminally
    terminal: int = 0
    lost: int = 0  # rows missing without a report
    duplicated: int = 0
    reordered: int = 0
    mismatched: int = 0
    recover_calls: int | None = None


def run_one(scenario: str, seed: int, rows: int, memory: str) -> dict[str, Result]:
    out: dict[str, Result] = {}
    for name, factory in FACTORIES.items():
        world = make_world(scenario, seed, rows, memory)
        controller = factory(world)
        res, seen, last = Result(), set(), -1
        for outer in range(0, rows, OUTER):
            world.outer_index = outer // OUTER
            ids = list(range(outer, min(rows, outer + OUTER)))
            try:
                got = controller(world, {"id": ids, "len": [world.lengths[i] for i in ids]})
            except Lost as lost:
                res.terminal += lost.terminal
                if lost.terminal:
                    res.failed_rows += lost.rows
                else:
                    res.skipped += lost.rows
                continue
            res.skipped += getattr(controller, "reported_skips", 0)
            for i, value in zip(got["id"], got["out"], strict=True):
                if i in seen:
                    res.duplicated += 1
                    continue
                seen.add(i)
                res.reordered += i < last
                last = max(last, i)
                res.mismatched += value != i * 2 + int(world.lengths[i])
            res.rows_out += len(got["id"])
        res.lost = rows - len(seen) - res.skipped - res.failed_rows
        res.secs, res.wasted, res.ooms, res.max_slice_ooms = world.clock, world.wasted, world.ooms, world.max_slice_ooms
        res.recover_calls = world.recover.get("calls") if scenario == "step" else None
        out[name] = res
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--memory", choices=("sum", "padded", "padded2"), default="sum")
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=SCENARIOS)
    args = parser.parse_args(argv)
    from loguru import logger

    logger.disable("data_juicer_elastic")  # per-OOM log lines are not the result
    logger.disable("data_juicer")
    t0 = time.perf_counter()
    failed = False
    print(f"memory={args.memory} rows={args.rows} seeds={args.seeds} capacity={CAPACITY:.0f} outer={OUTER}\n")
    header = (
        "| scenario | controller | rows/s | vs DJ | wasted % | OOMs | max OOMs/slice | terminal | "
        "skipped rows | lost/dup/reordered/mismatch | recover calls |"
    )
    print(header)
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for scenario in args.scenarios:
        totals: dict[str, list[Result]] = {}
        for seed in range(args.seeds):
            for name, res in run_one(scenario, seed, args.rows, args.memory).items():
                totals.setdefault(name, []).append(res)
        dj = _rate(totals["data-juicer-1.6.1"])
        for name, results in totals.items():
            rate = _rate(results)

            def s(attr: str, results: list[Result] = results) -> int:
                return sum(getattr(r, attr) for r in results)

            silent = (s("lost"), s("duplicated"), s("reordered"), s("mismatched"))
            failed |= name.startswith("ours") and any(silent)
            rec = [r.recover_calls for r in results if r.recover_calls is not None]
            print(
                f"| {scenario} | {name} | {rate:,.0f} | {f'{rate / dj:.2f}x' if dj else 'n/a'} | "
                f"{100 * s('wasted') / s('secs'):.1f} | "
                f"{s('ooms')} | {max(r.max_slice_ooms for r in results)} | {s('terminal')} | {s('skipped')} | "
                f"{'/'.join(map(str, silent))} | {round(sum(rec) / len(rec)) if rec else ''} |"
            )
    print(f"\n({time.perf_counter() - t0:.1f}s wall)")
    return 1 if failed else 0


def _rate(results: list[Result]) -> float:
    return sum(r.rows_out for r in results) / max(1e-9, sum(r.secs for r in results))


if __name__ == "__main__":
    raise SystemExit(main())
