"""The job summary's brief, ``summary/brief.json.z``: the part of the summary every worker reads
every round (what it needs to pick a claim and to gate one), compact and zlib-compressed.

``summary.json`` has everything (each live claim's attempt id and watched heartbeat value, each
node's counts) for ``dj-elastic status``; at 1,000 workers it is about 400 kB, and every worker
reading it every round would be about 80 MB/s of NAS reads.  The brief keeps what a worker uses:
the done bitmap, the terminal failures, each live claim's place in the manifest and holder (node,
pid), the watched value of the stale candidates only, and each node's shard time; columns
instead of objects, then zlib.  ``summary.seq`` names the brief's checksum, so a reader that
already has that brief does not read it again (docs/leases-on-nfs.md, item 8).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import ClassVar

from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import ChecksummedRecord
from data_juicer_elastic.sharedfs import fsio

COMPRESSION_LEVEL = 6  # zlib's default: level 9 saves under 1 % here for twice the writer's CPU


@dataclass(frozen=True)
class SummaryBrief(ChecksummedRecord):
    KIND: ClassVar[str] = "summary-brief"
    COMPACT: ClassVar[bool] = True
    job_id: str
    num_shards: int
    interval_secs: float
    done: str  # base64 of the done bitmap, bit i = shard i of the manifest (as summary.json's)
    done_count: int
    failed: list[str]  # terminally failed shards
    nodes: list[str]  # every node with a pace record; the columns below index it
    secs_per_shard: list[float | None]  # each node's mean shard time (NodePace.secs_per_shard), to the ms
    first_secs: list[float | None]  # each node's one accepted attempt's duration (NodePace.first_secs), to the ms
    live_shards: list[int]  # the live claims' places in the manifest, ascending
    live_nodes: list[int]  # each live claim's holder: its node's place in ``nodes`` ...
    live_pids: list[int]  # ... and its pid
    stale_tokens: dict[str, str]  # stale candidates only: shard id -> the heartbeat value the writer watched
    checksum: str | None = None

    def check(self) -> None:
        """ValueError when the columns do not fit together (a checksum does not catch a writer's bug)."""
        live, nodes = len(self.live_shards), len(self.nodes)
        if not (
            len(self.secs_per_shard) == len(self.first_secs) == nodes
            and len(self.live_nodes) == live == len(self.live_pids)
        ):
            raise ValueError("summary brief: columns of different lengths")
        if any(not 0 <= place < self.num_shards for place in self.live_shards):
            raise ValueError("summary brief: a live claim outside the manifest")
        if any(not 0 <= node < nodes for node in self.live_nodes):
            raise ValueError("summary brief: a live claim's node outside the node table")


def encode_brief(brief: SummaryBrief) -> bytes:
    return zlib.compress(brief.encode(), COMPRESSION_LEVEL)


def decode_brief(data: bytes, where: str) -> SummaryBrief:
    """The brief in ``data``; ValueError or JobDirError when it is truncated, damaged (its checksum),
    inflates beyond a record's limit, or its columns do not fit together."""
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, fsio.MAX_RECORD_BYTES + 1)
    except zlib.error as exc:
        raise ValueError(f"summary brief: {exc}") from None
    if not inflater.eof or inflater.unconsumed_tail or len(raw) > fsio.MAX_RECORD_BYTES:
        raise ValueError("summary brief: truncated, or larger than a record may be")
    brief = SummaryBrief.parse_checked(raw, where)
    brief.check()
    return brief


def write_brief(layout: JobLayout, brief: SummaryBrief) -> str:
    """Write the brief; its checksum (what ``summary.seq`` names)."""
    body = brief.to_dict()
    fsio.atomic_write(layout.summary_brief, encode_brief(brief), durable=False)
    return body["checksum"]


def read_brief(layout: JobLayout) -> SummaryBrief | None:
    """The brief on disk; None when there is none; ValueError / JobDirError / OSError when unreadable."""
    data = fsio.read_record(layout.summary_brief)
    return None if data is None else decode_brief(data, str(layout.summary_brief))
