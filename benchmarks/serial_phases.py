"""Project the serial phases of a job to a large fleet, from per-byte costs measured here.

A job's wall time is (time to the first shard running) + (shards running) + (what remains after
the last shard).  The middle part scales with the fleet; the two ends are what this projects:

  before  one elected node prepares: it reads every byte, checks every row, writes every shard
          (bounded by its cores and by its network link, in and out), then one node merges every
          output byte into one file;
  after   one node plans (a stat per input file, one short read per cut), every node scans its
          share of the shards (each byte read once, by the fleet at once; a barrier), the shards
          run; the output is published as parts (O(shards) renames) or merged by streaming while
          shards complete (one node's link still carries every output byte, overlapped with the
          run, and only the tail is left at the end).

Measured inputs (defaults: measured on a 2-core machine, benchmarks/README.md):

  --check-cpu-s-per-gb   CPU-seconds per GB to read, check and hash rows (the scan; the prepare
                         before also wrote the shards: --prepare-cpu-s-per-gb)
  --merge-cpu-s-per-gb   CPU-seconds per GB of the serial merge (validate + copy)
  --work-cpu-s-per-gb    CPU-seconds per GB of the recipe itself (the demo recipe on Ray)
  --plan-op-ms           one metadata operation or short read on the shared filesystem

The fleet: --nodes x --cores, each node's link --link-gbps (in and out), the storage's aggregate
bandwidth --storage-gbps; --input-tb, --output-fraction, --files, --shards-per-node.

    python benchmarks/serial_phases.py                      # 5 TB on 100 nodes x 32 cores, 10 GbE
    python benchmarks/serial_phases.py --nodes 20 --input-tb 1
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Fleet:
    input_gb: float
    output_fraction: float
    nodes: int
    cores: int
    link_gb_s: float  # one node's link, GB/s each way
    storage_gb_s: float  # the shared storage's aggregate bandwidth
    files: int
    shards: int


@dataclass(frozen=True)
class Costs:
    prepare_cpu_s_per_gb: float
    check_cpu_s_per_gb: float
    merge_cpu_s_per_gb: float
    work_cpu_s_per_gb: float
    plan_op_s: float
    prepare_helpers: int = 8  # row-checking helper processes a prepare started at most (rows.row_checkers)


def _rate(cores: float, cpu_s_per_gb: float, *links: float) -> float:
    """GB/s of a step: its cores' rate, capped by every link it moves the bytes through."""
    return min(cores / cpu_s_per_gb, *links)


def project(f: Fleet, c: Costs) -> dict[str, dict[str, float]]:
    out_gb = f.input_gb * f.output_fraction
    fleet_link = min(f.nodes * f.link_gb_s, f.storage_gb_s)
    work_rate = _rate(f.nodes * f.cores, c.work_cpu_s_per_gb, fleet_link)
    running = f.input_gb / work_rate
    # before: one node reads the input and writes every shard back (the same link, in and out)
    prepare_rate = _rate(min(f.cores, c.prepare_helpers + 1), c.prepare_cpu_s_per_gb, f.link_gb_s)
    prepare = f.input_gb / prepare_rate
    merge = out_gb / _rate(2, c.merge_cpu_s_per_gb, f.link_gb_s)  # one reader, one writer thread
    before = {"to_first_shard": prepare, "running": running, "after_last_shard": merge}
    # after: the plan (a stat per file, a short read per cut), then the fleet scans (a barrier)
    plan = (f.files + f.shards) * c.plan_op_s
    scan = f.input_gb / _rate(f.nodes * f.cores, c.check_cpu_s_per_gb, fleet_link)
    parts = f.shards * 3 * c.plan_op_s  # a link, a stat, an index line per shard
    # streaming merge: one node's link carries every output byte while shards run; what it cannot
    # keep up with is left at the end
    stream = max(0.0, out_gb / _rate(2, c.merge_cpu_s_per_gb, f.link_gb_s) - running)
    after_parts = {"to_first_shard": plan + scan, "running": running, "after_last_shard": parts}
    after_file = {"to_first_shard": plan + scan, "running": running, "after_last_shard": stream}
    return {"before (prepare, merge)": before, "after, export_layout parts": after_parts,
            "after, export_layout file (stream merge)": after_file}  # fmt: skip


def table(result: dict[str, dict[str, float]]) -> str:
    lines = [
        "| | to the first shard running | shards running | after the last shard | makespan | outside the shards' run |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, phases in result.items():
        total = sum(phases.values())
        serial = (phases["to_first_shard"] + phases["after_last_shard"]) / total
        cells = [_fmt(phases["to_first_shard"]), _fmt(phases["running"]), _fmt(phases["after_last_shard"])]
        lines.append(f"| {name} | {' | '.join(cells)} | {_fmt(total)} | {serial:.1%} |")
    return "\n".join(lines)


def _fmt(secs: float) -> str:
    if secs < 120:
        return f"{secs:.0f} s"
    if secs < 7200:
        return f"{secs / 60:.0f} min"
    return f"{secs / 3600:.1f} h"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input-tb", type=float, default=5.0)
    p.add_argument("--output-fraction", type=float, default=0.9)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--cores", type=int, default=32)
    p.add_argument("--link-gbps", type=float, default=10.0, help="each node's link, Gbit/s")
    p.add_argument("--storage-gbps", type=float, default=1000.0, help="the storage's aggregate bandwidth, Gbit/s")
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--shards-per-node", type=int, default=32)
    p.add_argument("--prepare-cpu-s-per-gb", type=float, default=4.26)
    p.add_argument("--check-cpu-s-per-gb", type=float, default=3.3)
    p.add_argument("--merge-cpu-s-per-gb", type=float, default=3.30)
    p.add_argument("--work-cpu-s-per-gb", type=float, default=700.0)
    p.add_argument("--plan-op-ms", type=float, default=1.0)
    a = p.parse_args()
    fleet = Fleet(
        input_gb=a.input_tb * 1000,
        output_fraction=a.output_fraction,
        nodes=a.nodes,
        cores=a.cores,
        link_gb_s=a.link_gbps / 8,
        storage_gb_s=a.storage_gbps / 8,
        files=a.files,
        shards=a.nodes * a.shards_per_node,
    )
    costs = Costs(a.prepare_cpu_s_per_gb, a.check_cpu_s_per_gb, a.merge_cpu_s_per_gb, a.work_cpu_s_per_gb,
                  a.plan_op_ms / 1000)  # fmt: skip
    print(table(project(fleet, costs)))


if __name__ == "__main__":
    main()
