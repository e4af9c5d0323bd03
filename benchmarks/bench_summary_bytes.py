"""How many bytes does every worker read of the job summary per round, and what is that at W workers?

Builds one round of the job summary with the real record classes and encoders (``JobSummary``,
``brief_of``, ``encode_brief``, ``SummarySeq``) for W workers (one per node), S shards, half of
them done, the live claims of W workers with claim-ahead (1.2 W), 2 % of them stale candidates,
realistic node names, pids, attempt ids and heartbeat values, and each node's measured shard
time.  The done set is either scattered at random (the worst case for compression: the bitmap is
incompressible) or in runs (what the claim cursor leaves: each worker walks its own region).
Then it reports the bytes of one read:

* **before**: ``summary.json`` (what every worker's keeper read each round before the brief);
* **after**: ``summary/brief.json.z`` (what workers read now), and ``summary.seq`` (read first);

and the projected NAS read rate ``bytes per read x reads/s x workers``: every worker reads the
summary once per round (5 s), and ``summary.seq`` on every look (at most every 0.5 s; the model
charges two a second, an upper bound while it claims and polls).

    python benchmarks/bench_summary_bytes.py [--workers 128 1000 2000] [--shards 20000 100000]

Also used by tests/benchmarks/test_scale_model.py (the 10 MB/s target at 1,000 x 100k).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass

from data_juicer_elastic.jobdir import heartbeats
from data_juicer_elastic.jobdir.job_summary import (
    JobSummary,
    LiveClaim,
    NodePace,
    SummarySeq,
    brief_of,
    encode_bitmap,
    encode_brief,
)
from data_juicer_elastic.jobdir.records import Heartbeat

INTERVAL_SECS = 5.0  # a summary round (job_summary.default_interval at the default TTL)
SEQ_READS_PER_SEC = 2.0  # a worker's looks at summary.seq: at most every 0.5 s (SummaryReader.min_interval)
LIVE_PER_WORKER = 1.2  # claim-ahead: a worker holds its running shard and, for the last 20 %, the next
STALE_SHARE = 0.02
MB = 1e6


@dataclass(frozen=True)
class Bytes:
    workers: int
    shards: int
    pattern: str
    summary: int  # summary.json
    brief: int  # brief.json.z
    seq: int  # summary.seq

    def before_mb_s(self) -> float:
        return self.summary * self.workers / INTERVAL_SECS / MB

    def after_mb_s(self) -> float:
        return (self.brief / INTERVAL_SECS + self.seq * SEQ_READS_PER_SEC) * self.workers / MB


def synthetic_round(workers: int, shards: int, pattern: str = "random", seed: int = 0) -> tuple[JobSummary, dict]:
    """One round of a job's summary (and the manifest's shard places) at this size."""
    rng = random.Random(seed)
    ids = [f"part-{i:06d}-of-{shards:06d}" for i in range(shards)]
    places = {shard: i for i, shard in enumerate(ids)}
    if pattern == "random":
        done = [i for i in range(shards) if rng.random() < 0.5]
    else:  # runs: each worker has walked a contiguous region of its own, half of it done
        region = shards // workers
        done = [w * region + k for w in range(workers) for k in range(region // 2)]
    done_set = set(done)
    nodes = [f"gpu-node-{k:04d}.cluster.example" for k in range(workers)]
    pids = [rng.randrange(1_000, 4_000_000) for _ in range(workers)]
    free = [i for i in range(shards) if i not in done_set]
    held = rng.sample(free, int(LIVE_PER_WORKER * workers))
    live = []
    for k, place in enumerate(sorted(held)):
        w = k % workers
        attempt = f"20261202T073746844Z-{nodes[w][:40]}-{pids[w]}-{rng.randbytes(6).hex()}"
        beat = Heartbeat(ids[place], 1, attempt, rng.randrange(1, 500), 0.0)
        stale = rng.random() < STALE_SHARE
        token = heartbeats.token_text(1, beat, None)
        live.append(LiveClaim(ids[place], 1, attempt, nodes[w], pids[w], token, round(rng.uniform(0, 30), 3), stale))
    paces = [
        NodePace(node, 1, 1, rng.randrange(shards // workers), rng.lognormvariate(4.1, 0.5), None, rng.randrange(10**7))
        for node in nodes
    ]
    summary = JobSummary(
        job_id="0123456789abcdef0123456789abcdef",
        num_shards=shards,
        seq="1.1234",
        writer=f"{nodes[0]}-{pids[0]}-{rng.randbytes(6).hex()}",
        written_at=1796197066.9826062,
        ttl_secs=120.0,
        interval_secs=INTERVAL_SECS,
        done=encode_bitmap(done, shards),
        done_count=len(done),
        failed=[ids[i] for i in rng.sample(free, 10) if i not in held],
        live=live,
        nodes=paces,
    )
    return summary, places


def measure(workers: int, shards: int, pattern: str = "random") -> Bytes:
    summary, places = synthetic_round(workers, shards, pattern)
    brief = brief_of(summary, places)
    seq = SummarySeq(summary.job_id, summary.seq, brief.to_dict()["checksum"]).encode()
    return Bytes(workers, shards, pattern, len(summary.encode()), len(encode_brief(brief)), len(seq))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[128, 1000, 2000])
    ap.add_argument("--shards", type=int, nargs="+", default=[20_000, 100_000])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = [measure(w, s, p) for w in a.workers for s in a.shards for p in ("random", "runs")]
    if a.json:
        print(json.dumps([{**r.__dict__, "before_mb_s": r.before_mb_s(), "after_mb_s": r.after_mb_s()} for r in rows]))
        return 0
    print(
        "| W | S | done set | summary.json (before) | brief.json.z + summary.seq (after) | NAS reads before | after |"
    )
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.workers} | {r.shards // 1000}k | {r.pattern} | {r.summary / 1000:.0f} kB | "
            f"{r.brief / 1000:.1f} kB + {r.seq} B | {r.before_mb_s():.1f} MB/s | {r.after_mb_s():.2f} MB/s |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
