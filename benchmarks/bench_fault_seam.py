"""What the fault-injection seam costs when no fault plan is installed.

Every job-directory file operation calls ``fault_seam.fault_point`` before it and (the mutating
ones) ``fault_seam.fault_done`` after it; unused, each is a global load and an ``is None`` test.
This measures, in one run on this machine:

1. ns per seam call with no hook, against an empty function call (the floor of any hook);
2. seam calls per shard, counted while a real worker loop (claims, heartbeats, attempt,
   publication, release; the fast fake runner from tests/faults) runs a small job;
3. wall time per shard of that loop with the seam unused, and with an installed but
   empty fault plan (what a test run pays);

and reports the unused seam's share of a shard's job-directory work.

    python benchmarks/bench_fault_seam.py [--shards 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_juicer_elastic.jobdir.worker_loop import run_worker  # noqa: E402
from data_juicer_elastic.jobdir.worker_settings import WorkerSettings  # noqa: E402
from data_juicer_elastic.sharedfs import (
    fault_seam,  # noqa: E402
)
from data_juicer_elastic.sharedfs.identity import WorkerIdentity  # noqa: E402
from tests.faults.crashpoints import FaultPlan, install  # noqa: E402
from tests.faults.fakes import fsio_runner, prepare  # noqa: E402


def _noop(op: str, path: Path) -> None:
    return None


def per_call_ns(n: int = 2_000_000) -> tuple[float, float]:
    path = Path("/job/claims/part-00000-of-00001/gen-000001.json")
    seam = min(timeit.repeat(lambda: fault_seam.fault_point("link", path), number=n, repeat=5)) / n * 1e9
    empty = min(timeit.repeat(lambda: _noop("link", path), number=n, repeat=5)) / n * 1e9
    return seam, empty


def run_job(root: Path, shards: int) -> float:
    job = prepare(root, rows=shards * 5, shards=shards)
    t0 = time.perf_counter()
    summary = run_worker(
        job,
        WorkerIdentity.current("bench"),
        fsio_runner(),
        WorkerSettings(ttl_secs=60, heartbeat_secs=10, max_retries=0, poll_interval_secs=0.05),
    )
    elapsed = time.perf_counter() - t0
    assert summary.complete
    return elapsed


def count_calls(root: Path, shards: int) -> int:
    calls = 0

    def count(op: str, path: Path) -> None:
        nonlocal calls
        calls += 1

    fault_seam.set_fault_hook(count, count)
    try:
        run_job(root, shards)
    finally:
        fault_seam.set_fault_hook(None)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()}")
    seam_ns, empty_ns = per_call_ns()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        calls = count_calls(root / "count", args.shards) / args.shards
        unused, empty_plan = [], []
        for i in range(args.repeat):  # interleaved, so load changes hit both variants alike
            unused.append(run_job(root / f"u{i}", args.shards) / args.shards)
            install(FaultPlan([]))
            try:
                empty_plan.append(run_job(root / f"p{i}", args.shards) / args.shards)
            finally:
                install(None)
    per_shard = statistics.median(unused)
    seam_share = calls * seam_ns * 1e-9 / per_shard
    print(f"seam call, no hook:          {seam_ns:6.1f} ns   (empty Python call: {empty_ns:.1f} ns)")
    print(f"seam calls per shard:        {calls:6.1f}")
    print(f"worker loop per shard:       {per_shard * 1e3:6.2f} ms unused seam, "
          f"{statistics.median(empty_plan) * 1e3:.2f} ms with an empty fault plan installed "
          f"(ratio {statistics.median(empty_plan) / per_shard:.3f})")  # fmt: skip
    print(f"unused seam / shard's job-dir work: {seam_share:.5%}")


if __name__ == "__main__":
    main()
