"""Writing + fsyncing 1 GB with and without reserving the space first (checked_writer.preallocate).

Prepare's shards and merge's output are written with a size hint, which fsio turns into
fallocate(FALLOC_FL_KEEP_SIZE) where the filesystem supports it.  This measures what that
does on the disk under --workdir: the sides alternate, the previous file is removed and
`sync` runs (untimed) before each run, and every run is printed.

    python benchmarks/bench_preallocate.py --workdir /tmp/dje-prealloc --size-gb 1 --rounds 4
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from data_juicer_elastic.sharedfs import checked_writer  # noqa: E402

BLOCK = 8 << 20


def write(path: Path, data: memoryview, reserve: bool) -> tuple[float, float]:
    """(wall seconds, system CPU seconds) of one checked write + fsync of ``data``."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    writer = checked_writer.BufferedCheckedWriter(path, size_hint=len(data) if reserve else 0)
    for start in range(0, len(data), BLOCK):
        writer.write(data[start : start + BLOCK])
    writer.finish()
    return time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_stime - r0.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-prealloc"))
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    data = memoryview(os.urandom(BLOCK) * max(1, int(args.size_gb * 1e9) // BLOCK))
    target = args.workdir / "out.bin"
    seen: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for reserve in (False, True):
            target.unlink(missing_ok=True)
            os.sync()
            seen[reserve].append(write(target, data, reserve))
            wall, sys_cpu = seen[reserve][-1]
            print(f"reserve={reserve}: {wall:.2f} s, system {sys_cpu:.2f} s", flush=True)
    target.unlink(missing_ok=True)
    for reserve, runs in seen.items():
        walls = [w for w, _ in runs]
        print(
            f"reserve={reserve}: median {statistics.median(walls):.2f} s, "
            f"range {min(walls):.2f}-{max(walls):.2f} s ({len(data) / 1e6:.0f} MB)"
        )


if __name__ == "__main__":
    main()
