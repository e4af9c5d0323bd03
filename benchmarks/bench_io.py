"""Prepare and merge against the copy tools on the same disk: one run, ratios.

  prepare ratio = prepare MB/s / `cp` MB/s of the same input file (target >= 0.5)
  merge ratio   = merge MB/s (every line parsed, every shard re-hashed, the merged sha256)
                  / `cat` MB/s of the same shard outputs into one file (target >= 0.5)
  gz / zst      = prepare MB/s of input.jsonl.gz / .zst / `zcat` / `zstd -dc` MB/s to /dev/null,
                  both counted in decompressed bytes

Prepare and merge fsync what they write; `cp` and `cat` do not, so each ratio is also
given against "cp; sync FILE" / "cat > FILE; sync FILE".  The page cache is dropped once at
the start where the kernel allows it (``page_cache_dropped`` in the results), then every input
is read once before timing (all sides run warm), and the sides alternate (baseline, ours,
baseline, ours, ...) so both see the same warm cache and the same neighbours, after one
warm-up round that is dropped; before each timed run the previous output is removed and
`sync` runs, untimed; the median of ``--repeat`` runs is reported, with `uptime` before and
after each section.  CPU seconds per GB (user + sys, all threads and child processes) are
reported too: on a shared machine they say more about the cost than wall time does.
The "floor" section measures the work prepare and merge cannot skip (two SHA-256 passes, the
row checks, the write) alone, and divides it by the cores: no implementation of these
algorithms can be faster on this machine.

    python benchmarks/bench_io.py --workdir /tmp/dje-io --size-gb 1.0 --out benchmarks/results/bench_io.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from data_juicer_elastic.jobdir.tasks import ShardOutput  # noqa: E402
from data_juicer_elastic.jobdir.worker_loop import run_worker  # noqa: E402
from data_juicer_elastic.jobdir.worker_settings import WorkerSettings  # noqa: E402
from data_juicer_elastic.rows.shard_source import iter_source_lines  # noqa: E402
from data_juicer_elastic.shards.merge import merge_job  # noqa: E402
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job  # noqa: E402
from data_juicer_elastic.sharedfs.identity import WorkerIdentity  # noqa: E402

MB = 1e6


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def generate(path: Path, size: int, seed: int = 7) -> int:
    """Text rows like a pre-training corpus: ~1.7 kB of words, an id, a small meta object with a URL."""
    import orjson

    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10))) for _ in range(5000)]
    written = rows = 0
    with open(path, "wb") as handle:
        batch = []
        while written < size:
            text = " ".join(rng.choices(words, k=rng.randint(50, 400)))
            meta = {"source": "bench", "url": f"https://example.com/doc/{rows}", "lang": "en"}
            line = orjson.dumps({"id": rows, "text": text, "meta": meta}) + b"\n"
            batch.append(line)
            written += len(line)
            rows += 1
            if len(batch) >= 4096:
                handle.write(b"".join(batch))
                batch = []
        handle.write(b"".join(batch))
    return rows


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process's threads and its finished children)."""
    c0, t0 = _cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, _cpu() - c0


def sh(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=True)


def drop_page_cache() -> bool:
    """Start with free memory where the kernel allows it (root on the host's kernel): with the
    cache full of earlier files, every fresh page written must first be reclaimed, and that
    cost (seen here: 0.25 to 2.3 s of system time for the same 1 GB write) lands on whichever
    side happens to write then.  The inputs are read again (warm) right after."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def warm(*paths: Path) -> None:
    for path in paths:
        sh(f"cat {path} > /dev/null")


def alternate(sides: dict, repeat: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall and CPU seconds per side, running the sides in turn ``repeat`` times."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    # Round 0 is a warm-up, run and dropped: the first writes after a section's setup (GBs of
    # new and deleted files) were 1.5-5x slower for every side here, whichever ran first.
    for round_ in range(repeat + 1):
        for name, (setup, fn) in sides.items():
            if setup is not None:
                setup()
            # Untimed: this disk is mounted with online discard, so freeing the last run's
            # output costs the next journal commit ~1.5 s of system time (seen: `cat` of 1 GB
            # 0.36 s, or 2.0 s right after a deletion); sync lands it here, on nobody.
            os.sync()
            wall, cpu = timed(fn)
            print(
                f"    {name}: {wall:.2f} s, {cpu:.2f} CPU-s" + (" (warm-up, dropped)" if not round_ else ""), flush=True
            )
            if round_:
                times[name].append((wall, cpu))
    wall = {name: statistics.median(w for w, _ in values) for name, values in times.items()}
    cpu = {name: statistics.median(c for _, c in values) for name, values in times.items()}
    return wall, cpu


def prepare(data: Path, job: Path, shards: int, codec: str = "none") -> None:
    shutil.rmtree(job, ignore_errors=True)  # a no-op when run by alternate(): its setup removed it
    request = PrepareRequest(
        job_dir=job, dataset_path=data, num_shards=shards, recipe={}, stage_identities=[], shard_codec=codec
    )
    prepare_job(request)


def identity_outputs(job: Path) -> None:
    """Accepted results without Ray: each shard's output is its input (the validation path is the same)."""

    def copy(task):
        out = task.attempt_dir / "output.jsonl"
        out.write_bytes(b"".join(line + b"\n" for line in iter_source_lines(task.source)))
        return ShardOutput(out, sum(1 for _ in open(out, "rb")))

    run_worker(
        job,
        WorkerIdentity.current("bench"),
        copy,
        WorkerSettings(ttl_secs=600, heartbeat_secs=60, max_retries=0, poll_interval_secs=1),
    )


def floor(data: Path, repeat: int) -> dict:
    """CPU seconds of the work prepare and merge cannot skip, each measured alone on ``data``:
    one SHA-256 pass, the row check (split + jiter + simdjson, as a helper process runs it),
    the output-only check (split + simdjson, as merge runs it), and writing + fsyncing the
    bytes (no reads).  Prepare does two hashes (input, shards), one row check and one write; merge two hashes (shards,
    merged file), one output check and one write.  Spread perfectly over the cores, that sum
    is the fastest either could be with these algorithms on this machine."""
    import hashlib

    import simdjson

    from data_juicer_elastic.rows.jsonl import NormaliseOptions, RowNormaliser
    from data_juicer_elastic.rows.row_policy import is_object

    # Blocks of whole lines held in memory, so no part is charged for reading the file
    # (prepare and merge do read it): the floor errs low, never high.
    held, carry = [], b""
    with open(data, "rb", buffering=0) as handle:
        while chunk := handle.read(8 << 20):
            block = carry + chunk
            cut = block.rfind(b"\n") + 1
            carry = block[cut:]
            held.append(block[:cut])

    def blocks():
        return iter(held)

    def sha():
        digest = hashlib.sha256()
        for block in blocks():
            digest.update(block)

    normaliser = RowNormaliser("", NormaliseOptions(str(data.parent), {}, None), 0)

    def rows(check):
        for block in blocks():
            lines = block.split(b"\n")
            lines.pop()
            assert check(lines)

    target = data.with_name("floor.out")

    def write():
        target.unlink(missing_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        for block in blocks():
            os.write(fd, block)
        os.fsync(fd)
        os.close(fd)

    parts = {
        "sha256": sha,
        "input check": lambda: rows(normaliser.is_clean),
        "output check": lambda: rows(lambda lines, parser=simdjson.Parser(): all(is_object(parser, x) for x in lines)),
        "write+fsync": write,
    }
    cpu = {name: statistics.median(timed(fn)[1] for _ in range(repeat)) for name, fn in parts.items()}
    target.unlink(missing_ok=True)
    cores = os.cpu_count() or 1
    prepare_cpu = 2 * cpu["sha256"] + cpu["input check"] + cpu["write+fsync"]
    merge_cpu = 2 * cpu["sha256"] + cpu["output check"] + cpu["write+fsync"]
    result = {
        "cpu_s": cpu,
        "cores": cores,
        "prepare_cpu_s": prepare_cpu,
        "merge_cpu_s": merge_cpu,
        "prepare_best_s": prepare_cpu / cores,
        "merge_best_s": merge_cpu / cores,
    }
    print(
        "floor (CPU-s for this input): "
        + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
        + f"; prepare >= {prepare_cpu:.2f} CPU-s = {prepare_cpu / cores:.2f} s on {cores} cores,"
        + f" merge >= {merge_cpu:.2f} CPU-s = {merge_cpu / cores:.2f} s",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dje-io"))
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--input", type=Path, help="reuse a file written by an earlier run (generation is seeded)")
    parser.add_argument("--sections", default="floor,prepare,merge,zstd,gzip", help="comma-separated subset to run")
    parser.add_argument("--keep-page-cache", action="store_true", help="do not drop the page cache at the start")
    args = parser.parse_args()
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    data = work / "input.jsonl"
    results: dict = {"uptime": {"start": uptime()}, "cpus": os.cpu_count()}
    if args.input is not None:
        shutil.copyfile(args.input, data)
        rows = sum(1 for _ in open(data, "rb"))
    else:
        rows = generate(data, int(args.size_gb * 1e9))
    size = data.stat().st_size
    results["input"] = {"bytes": size, "rows": rows, "shards": args.shards}
    print(f"input: {size / MB:.0f} MB, {rows} rows; {results['uptime']['start']}")

    # -- the floor: what the mandatory work alone costs here ----------------------------------
    results["page_cache_dropped"] = not args.keep_page_cache and drop_page_cache()
    warm(data)
    sections = set(args.sections.split(","))
    if "floor" in sections:
        results["floor"] = floor(data, args.repeat)

    copy = work / "copy.jsonl"
    job = work / "job"
    if "prepare" in sections:
        _prepare_section(results, data, size, copy, job, args)
    if "merge" in sections:
        _merge_section(results, data, work, job, args)
    for codec in ("zstd", "gzip"):
        if codec in sections:
            _compressed_section(results, codec, data, size, work, job, args)

    results["uptime"]["end"] = uptime()
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)


def _prepare_section(results: dict, data: Path, size: int, copy: Path, job: Path, args) -> None:
    results["uptime"]["prepare"] = uptime()
    secs = alternate(
        {
            "cp": (lambda: copy.unlink(missing_ok=True), lambda: sh(f"cp {data} {copy}")),
            "cp+sync": (lambda: copy.unlink(missing_ok=True), lambda: sh(f"cp {data} {copy} && sync {copy}")),
            "prepare": (lambda: shutil.rmtree(job, ignore_errors=True), lambda: prepare(data, job, args.shards)),
        },
        args.repeat,
    )
    copy.unlink(missing_ok=True)
    results["prepare"] = _ratios(size, secs, "prepare", ("cp", "cp+sync"))
    if "floor" in results:
        best = results["floor"]["prepare_best_s"]
        results["prepare"]["best_possible_ratio"] = {b: secs[0][b] / best for b in ("cp", "cp+sync")}
        print(f"  floor: prepare cannot beat {best:.2f} s here = ratio {secs[0]['cp'] / best:.2f} vs cp", flush=True)


def _merge_section(results: dict, data: Path, work: Path, job: Path, args) -> None:
    prepare(data, job, args.shards)
    identity_outputs(job)
    outputs = sorted(job.glob("attempts/*/*/output.jsonl"))
    out_bytes = sum(p.stat().st_size for p in outputs)
    listing = " ".join(str(p) for p in outputs)
    merged, catted = work / "merged.jsonl", work / "cat.jsonl"
    warm(*outputs)
    results["uptime"]["merge"] = uptime()
    secs = alternate(
        {
            "cat": (lambda: catted.unlink(missing_ok=True), lambda: sh(f"cat {listing} > {catted}")),
            "cat+sync": (
                lambda: catted.unlink(missing_ok=True),
                lambda: sh(f"cat {listing} > {catted} && sync {catted}"),
            ),
            "merge": (lambda: merged.unlink(missing_ok=True), lambda: merge_job(job, merged)),
        },
        args.repeat,
    )
    assert merged.read_bytes() == catted.read_bytes()
    results["merge"] = _ratios(out_bytes, secs, "merge", ("cat", "cat+sync"))
    if "floor" in results:
        best = results["floor"]["merge_best_s"]
        results["merge"]["best_possible_ratio"] = {b: secs[0][b] / best for b in ("cat", "cat+sync")}
        print(f"  floor: merge cannot beat {best:.2f} s here = ratio {secs[0]['cat'] / best:.2f} vs cat", flush=True)
    for path in (merged, catted):
        path.unlink(missing_ok=True)
    shutil.rmtree(job, ignore_errors=True)


def _compressed_section(results: dict, codec: str, data: Path, size: int, work: Path, job: Path, args) -> None:
    compress, decompress = {
        "zstd": (f"zstd -q -3 -T0 -f {data} -o {work / 'input.jsonl.zst'}", "zstd -dc"),
        "gzip": (f"gzip -1 -c {data} > {work / 'input.jsonl.gz'}", "zcat"),
    }[codec]
    packed = work / ("input.jsonl.zst" if codec == "zstd" else "input.jsonl.gz")
    sh(compress)
    warm(packed)
    results["uptime"][codec] = uptime()
    secs = alternate(
        {
            decompress: (None, lambda: sh(f"{decompress} {packed} > /dev/null")),
            "prepare": (lambda: shutil.rmtree(job, ignore_errors=True), lambda: prepare(packed, job, args.shards)),
        },
        args.repeat,
    )
    results[f"prepare_{codec}"] = _ratios(size, secs, "prepare", (decompress,))
    results[f"prepare_{codec}"]["compressed_bytes"] = packed.stat().st_size
    packed.unlink()
    shutil.rmtree(job, ignore_errors=True)


def _ratios(size: int, measured: tuple[dict[str, float], dict[str, float]], ours: str, baselines) -> dict:
    secs, cpu = measured
    rate = {name: size / s / MB for name, s in secs.items()}
    cpu_per_gb = {name: c / size * 1e9 for name, c in cpu.items()}
    line = f"{ours}: {rate[ours]:.0f} MB/s, {cpu_per_gb[ours]:.2f} CPU-s/GB; " + "; ".join(
        f"{b}: {rate[b]:.0f} MB/s, {cpu_per_gb[b]:.2f} CPU-s/GB (ratio {rate[ours] / rate[b]:.2f})" for b in baselines
    )
    print(line, flush=True)
    return {
        "seconds": secs,
        "mb_per_s": rate,
        "cpu_s_per_gb": cpu_per_gb,
        "ratios": {b: rate[ours] / rate[b] for b in baselines},
    }


if __name__ == "__main__":
    main()
