"""The compacted job summary: ``summary/summary.json`` (everything, for ``status``), its brief
``summary/brief.json.z`` (what workers read), ``summary/summary.seq``, each worker process's pace
record ``summary/paces/<worker>.json``, and how workers read them.  A hint, never the authority: a
missing or stale one only shows a held shard as free (a claimer probes it) or a node's pace as
unknown; rules, and when a reader walks the job dir instead: docs/leases-on-nfs.md, item 8.
"""

from __future__ import annotations

import base64
import copy
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import ClassVar

from loguru import logger

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout, ensure_dir
from data_juicer_elastic.jobdir.records import ChecksummedRecord, Manifest, Record
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity, safe_name

MIN_INTERVAL_SECS = 0.25


def default_interval(ttl_secs: float) -> float:
    """How often the writer rewrites the summary: 5 s, or an eighth of a short TTL."""
    return max(MIN_INTERVAL_SECS, min(5.0, ttl_secs / 8))


def fresh_for(ttl_secs: float, interval_secs: float) -> float:
    """How long a reader trusts a summary whose sequence stopped changing (its writer may be gone)."""
    return max(3 * interval_secs, ttl_secs / 2)


@dataclass(frozen=True)
class LiveClaim:
    shard_id: str
    generation: int
    attempt_id: str
    node_id: str
    pid: int
    token: str  # the heartbeat value the writer watched (heartbeats.token_text)
    unchanged_secs: float  # for how long the writer saw it unchanged, on its own clock
    stale: bool  # unchanged for a TTL, or the holder's pid is gone on the writer's host


@dataclass(frozen=True)
class NodePace:
    node_id: str
    workers: int  # worker processes of the node that have not left
    running: int  # live claims of the node
    done: int  # accepted results of the node
    secs_per_shard: float | None  # mean over attempts after each process's first (else the firsts')
    first_secs: float | None  # when the node has exactly one accepted attempt: its duration
    rows_out: int


@dataclass(frozen=True)
class JobSummary(ChecksummedRecord):
    KIND: ClassVar[str] = "summary"
    COMPACT: ClassVar[bool] = True  # every worker reads it every few seconds; indentation would be a third of it
    job_id: str
    num_shards: int
    seq: str  # "<writer lease generation>.<round>": changes with every write, whoever writes
    writer: str  # the writing process's pace key
    written_at: float  # the writer's wall clock (display only)
    ttl_secs: float
    interval_secs: float
    done: str  # base64 of the done bitmap, bit i = shard i of the manifest
    done_count: int
    failed: list[str]  # terminally failed shards (failed/ markers)
    live: list[LiveClaim]
    nodes: list[NodePace]
    checksum: str | None = None


@dataclass(frozen=True)
class SummarySeq(Record):
    KIND: ClassVar[str] = "summary-seq"
    job_id: str
    seq: str
    brief: str  # the checksum of the round's brief: a reader holding that brief does not read it again


def encode_bitmap(indices: Iterator[int] | list[int], n: int) -> str:
    bits = bytearray((n + 7) // 8)
    for i in indices:
        bits[i >> 3] |= 1 << (i & 7)
    return base64.b64encode(bytes(bits)).decode("ascii")


def decode_bitmap(text: str, n: int) -> bytes:
    bits = base64.b64decode(text.encode("ascii"), validate=True)
    if len(bits) != (n + 7) // 8:
        raise ValueError(f"done bitmap of {len(bits)} bytes for {n} shards")
    return bits


def seq_order(seq: str) -> tuple[int, int] | None:
    """``(writer generation, round)`` of a sequence, to order rounds of different writers; None for
    a sequence of another form."""
    generation, _, rest = seq.partition(".")
    return (int(generation), int(rest)) if generation.isdigit() and rest.isdigit() else None


def brief_of(summary: JobSummary, places: Mapping[str, int]) -> SummaryBrief:
    """What workers read of ``summary`` (``places``: each shard's place in the manifest)."""
    nodes = [node.node_id for node in summary.nodes]
    node_place = {node: i for i, node in enumerate(nodes)}
    live = sorted(summary.live, key=lambda claim: places[claim.shard_id])
    return SummaryBrief(
        job_id=summary.job_id,
        num_shards=summary.num_shards,
        interval_secs=summary.interval_secs,
        done=summary.done,
        done_count=summary.done_count,
        failed=summary.failed,
        nodes=nodes,
        secs_per_shard=[_to_ms(node.secs_per_shard) for node in summary.nodes],
        first_secs=[_to_ms(node.first_secs) for node in summary.nodes],
        live_shards=[places[claim.shard_id] for claim in live],
        live_nodes=[node_place[claim.node_id] for claim in live],
        live_pids=[claim.pid for claim in live],
        stale_tokens={claim.shard_id: claim.token for claim in live if claim.stale},
    )


def _to_ms(secs: float | None) -> float | None:
    """A shard time to the millisecond: the gate compares shard times of seconds or more, and the
    17 digits of a mean would be a third of the brief's compressed bytes at 1,000 nodes."""
    return None if secs is None else round(secs, 3)


def write_summary(layout: JobLayout, summary: JobSummary, brief: SummaryBrief) -> None:
    """The brief, the summary, then the sequence record that names both (a reader that sees the new
    seq finds them; one that finds another brief than the seq names waits for the next seq)."""
    checksum = write_brief(layout, brief)
    fsio.atomic_write(layout.summary, summary.encode(), durable=False)
    seq = SummarySeq(summary.job_id, summary.seq, checksum)
    fsio.atomic_write(layout.summary_seq, seq.encode(), durable=False)


def read_summary(layout: JobLayout, manifest: Manifest) -> JobSummary | None:
    """The summary when it exists, is intact (checksum) and describes this job; else None."""
    try:
        data = fsio.read_record(layout.summary)
        if data is None:
            return None
        summary = JobSummary.parse_checked(data, layout.summary)
        decode_bitmap(summary.done, summary.num_shards)
    except (OSError, JobDirError, ValueError):
        return None
    return summary if (summary.job_id, summary.num_shards) == (manifest.job_id, manifest.num_shards) else None


def read_brief_named(layout: JobLayout, manifest: Manifest, checksum: str) -> SummaryBrief | None:
    """The brief when it exists, is intact, describes this job and is the one ``summary.seq`` named
    (``checksum``); else None."""
    try:
        brief = read_brief(layout)
        if brief is None:
            return None
        decode_bitmap(brief.done, brief.num_shards)
    except (OSError, JobDirError, ValueError):
        return None
    named = (brief.checksum, brief.job_id, brief.num_shards) == (checksum, manifest.job_id, manifest.num_shards)
    return brief if named else None


@dataclass(frozen=True)
class Holder:
    """A live claim as workers see it in the brief."""

    node_id: str
    pid: int
    stale: bool  # its writer found it stale
    token: str | None  # when stale: the heartbeat value the writer watched


@dataclass(frozen=True)
class NodeSpeed:
    node_id: str
    secs_per_shard: float | None
    first_secs: float | None


class SummaryView:
    """One brief as a worker uses it; ``seq``: the round that named it (rounds with the same
    content share a brief)."""

    def __init__(self, brief: SummaryBrief, seq: str, manifest: Manifest):
        self.brief, self.seq, self.manifest = brief, seq, manifest
        self.interval_secs = brief.interval_secs
        self._bits = decode_bitmap(brief.done, brief.num_shards)
        self.failed = frozenset(brief.failed)
        shards, tokens = manifest.shards, brief.stale_tokens
        self.live: dict[str, Holder] = {}
        for place, node, pid in zip(brief.live_shards, brief.live_nodes, brief.live_pids, strict=True):
            shard = shards[place].shard_id
            self.live[shard] = Holder(brief.nodes[node], pid, shard in tokens, tokens.get(shard))
        self.nodes = [
            NodeSpeed(*node) for node in zip(brief.nodes, brief.secs_per_shard, brief.first_secs, strict=True)
        ]

    def at_seq(self, seq: str) -> SummaryView:
        """This view as named by a later round whose brief is the same."""
        view = copy.copy(self)
        view.seq = seq
        return view

    def is_done(self, index: int) -> bool:
        return bool(self._bits[index >> 3] & (1 << (index & 7)))

    def done_indices(self) -> Iterator[int]:
        for byte_index, byte in enumerate(self._bits):
            while byte:
                low = byte & -byte
                yield byte_index * 8 + low.bit_length() - 1
                byte ^= low

    def done_ids(self) -> set[str]:
        shards = self.manifest.shards
        return {shards[i].shard_id for i in self.done_indices()}

    @property
    def all_done(self) -> bool:
        return self.brief.done_count == self.brief.num_shards

    def held_by_other(self, shard_id: str, pid: int, node_id: str) -> bool:
        """A live claim of another process that its writer did not find stale: not worth a probe."""
        claim = self.live.get(shard_id)
        return claim is not None and not claim.stale and (claim.node_id, claim.pid) != (node_id, pid)

    def stale_token(self, shard_id: str) -> str | None:
        claim = self.live.get(shard_id)
        return claim.token if claim is not None and claim.stale else None

    def unclaimed(self) -> list[str]:
        """Shards neither done, failed nor held by a live claim (pending, or a stale candidate)."""
        return [
            shard
            for i, shard in enumerate(self.manifest.shard_ids)
            if not self.is_done(i) and shard not in self.failed and (shard not in self.live or self.live[shard].stale)
        ]

    def counts(self) -> dict[str, int]:
        stale = sum(1 for claim in self.live.values() if claim.stale)
        live = len(self.live)
        counts = {"done": self.brief.done_count, "failed": len(self.failed), "running": live - stale, "stale": stale}
        return {**counts, "pending": max(0, self.brief.num_shards - sum(counts.values()))}


class SummaryReader:
    """A worker's cached view of the summary: one small read per ``min_interval`` at most, the
    summary itself only when its sequence changed; None while there is no trustworthy one."""

    def __init__(
        self,
        layout: JobLayout,
        manifest: Manifest,
        *,
        ttl_secs: float,
        min_interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.layout, self.manifest, self.clock = layout, manifest, clock
        self.interval_secs = default_interval(ttl_secs)
        self.fresh_secs = fresh_for(ttl_secs, self.interval_secs)
        self.min_interval = min_interval
        self._checked_at: float | None = None
        self._seq: str | None = None
        self._changed_at = 0.0
        self._view: SummaryView | None = None
        self._advancing = False
        self._newest: tuple[int, int] | None = None  # the newest (generation, round) read
        self.briefs_read = 0  # reads of the brief itself (the rounds that changed it)
        self._lock = threading.Lock()  # the worker loop, the claim-ahead helper and the keeper share it

    def view(self) -> SummaryView | None:
        with self._lock:
            now = self.clock()
            if self._checked_at is None or now - self._checked_at >= self.min_interval:
                self._checked_at = now
                self._refresh(now)
        return self.current()

    def current(self) -> SummaryView | None:
        """The last view read, while it is trusted (its sequence was seen to change) and fresh; no read."""
        if self._view is None or not self._advancing or self.clock() - self._changed_at >= self.fresh_secs:
            return None
        return self._view

    def unchanged_for(self) -> float | None:
        """Seconds since the sequence last changed (None: never seen): the keeper's cue."""
        return None if self._seq is None else self.clock() - self._changed_at

    def _refresh(self, now: float) -> None:
        try:
            seq = SummarySeq.read(self.layout.summary_seq)
        except (OSError, JobDirError):
            return
        if seq is None or seq.job_id != self.manifest.job_id or seq.seq == self._seq:
            return
        order = seq_order(seq.seq)
        if order is not None and self._newest is not None and order < self._newest:
            # A writer whose lease was taken over, stalled between its fencing check and its write:
            # its late round is older than one already read.
            return
        if self._view is not None and self._view.brief.checksum == seq.brief:
            view = self._view.at_seq(seq.seq)  # the writer is alive and nothing a worker reads changed
        else:
            brief = read_brief_named(self.layout, self.manifest, seq.brief)
            if brief is None:  # missing, torn, of another job, or not (yet) the brief the seq named
                return
            view = SummaryView(brief, seq.seq, self.manifest)
            self.briefs_read += 1
        if order is not None:
            self._newest = max(order, self._newest or order)
        self._advancing = self._seq is not None  # a change seen, not only a first sight
        self._seq, self._changed_at = seq.seq, now
        self._view = view


# This process's reader of each job it works on: the worker loop registers it, and whatever else in
# the process asks about the job (the claim gate, settle, the outcome at the end) reads through it.
_readers: dict[str, SummaryReader] = {}  # by job directory


def register_reader(reader: SummaryReader) -> None:
    _readers[str(reader.layout.root)] = reader


def reader_for(
    layout: JobLayout, manifest: Manifest, *, ttl_secs: float | None = None, clock: Callable[[], float] = time.monotonic
) -> SummaryReader | None:
    """This process's reader of the job; with ``ttl_secs`` one is made (and kept) when there is none."""
    reader = _readers.get(str(layout.root))
    if reader is not None and reader.manifest.job_id != manifest.job_id:
        reader = None  # another job in the same directory: this reader's summaries are not its
    if reader is None and ttl_secs is not None:
        reader = SummaryReader(layout, manifest, ttl_secs=ttl_secs, clock=clock)
        register_reader(reader)
    return reader


def view_of(layout: JobLayout, manifest: Manifest | None = None) -> SummaryView | None:
    """A fresh summary of the job in ``layout`` as this process reads it (with ``manifest``: only a
    reader of that very job); None without one (walk instead)."""
    reader = _readers.get(str(layout.root)) if manifest is None else reader_for(layout, manifest)
    return None if reader is None else reader.view()


class IdleBackoff:
    """How long an idle worker waits before it looks again: the poll interval, doubling up to the
    summary's interval while there is a fresh summary."""

    def __init__(self, poll_secs: float, reader: SummaryReader | None):
        self.poll_secs, self.reader = poll_secs, reader
        self._wait = poll_secs

    def reset(self) -> None:
        self._wait = self.poll_secs

    def next_wait(self) -> float:
        fresh = self.reader is not None and self.reader.current() is not None
        cap = max(self.poll_secs, self.reader.interval_secs) if fresh else self.poll_secs
        wait = min(self._wait, cap)
        self._wait = min(cap, self._wait * 2)
        return wait


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


def write_brief(layout: JobLayout, brief: SummaryBrief) -> str:
    """Write the brief; its checksum (what ``summary.seq`` names)."""
    body = brief.to_dict()
    fsio.atomic_write(layout.summary_brief, encode_brief(brief), durable=False)
    return body["checksum"]


def read_brief(layout: JobLayout) -> SummaryBrief | None:
    """The brief on disk; None when there is none; OSError, ValueError or JobDirError when it is unreadable,
    truncated, damaged (its checksum), inflates beyond a record's limit, or its columns do not fit together."""
    data = fsio.read_record(layout.summary_brief)
    if data is None:
        return None
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, fsio.MAX_RECORD_BYTES + 1)
    except zlib.error as exc:
        raise ValueError(f"summary brief: {exc}") from None
    if not inflater.eof or inflater.unconsumed_tail or len(raw) > fsio.MAX_RECORD_BYTES:
        raise ValueError("summary brief: truncated, or larger than a record may be")
    brief = SummaryBrief.parse_checked(raw, layout.summary_brief)
    brief.check()
    return brief


@dataclass(frozen=True)
class HeldClaim:
    shard_id: str
    generation: int
    attempt_id: str


@dataclass(frozen=True)
class PaceRecord(Record):
    KIND: ClassVar[str] = "pace"
    worker: str  # this record's key (node, pid and a random part: unique per process)
    node_id: str
    hostname: str
    boot_id: str
    pid_namespace: str
    pid: int
    seq: int  # +1 per write
    updated_at: float  # writer's wall clock (display only)
    held: list[HeldClaim] = field(default_factory=list)
    done: int = 0  # this process's accepted results
    first_secs: float | None = None  # its first accepted attempt's duration (its runtime's start included)
    warm_secs: float = 0.0  # the sum of the other accepted attempts' durations
    rows_out: int = 0
    stopped: bool = False  # the process left; it holds nothing
    rows_in: int = 0  # input rows of its accepted results
    quarantined: int = 0  # rows its accepted results set aside (jobdir.exports)
    first_claimed_at: float | None = None  # wall clock of its first claim (display only)
    last_done_at: float | None = None  # wall clock of its latest accepted result (display only)

    @property
    def warm_count(self) -> int:
        return max(self.done - 1, 0)


def worker_key(identity: WorkerIdentity) -> str:
    """A key for this process's record: readable, and unique even where pids repeat (containers)."""
    return f"{safe_name(identity.node_id)[:60]}-{identity.pid}-{secrets.token_hex(4)}"


def read_pace(layout: JobLayout, name: str) -> PaceRecord | None:
    """The record behind a ``paces/`` listing name; None when it is gone, foreign or corrupt."""
    if not name.endswith(".json") or name.startswith("."):
        return None
    try:
        return PaceRecord.read(layout.pace(name[: -len(".json")]))
    except (OSError, JobDirError):
        return None


def read_paces(layout: JobLayout) -> list[PaceRecord]:
    """Every readable pace record of the job: one listing of ``paces/``, read a few at a time."""
    return list(refresh_paces(layout, {}).values())


def refresh_paces(layout: JobLayout, previous: dict[str, PaceRecord]) -> dict[str, PaceRecord]:
    """The job's pace records by name; one in ``previous`` that said it stopped is not read again."""
    names = fsio.list_names(layout.paces_dir)
    known = {name: previous[name] for name in names if name in previous and previous[name].stopped}
    unread = [name for name in names if name not in known]
    fresh = dict(zip(unread, fsio.read_many(lambda name: read_pace(layout, name), unread), strict=True))
    records = {name: known.get(name) or fresh.get(name) for name in names}
    return {name: record for name, record in records.items() if record is not None}


class PaceWriter:
    """This process's pace record: updated in memory, written when it changed (thread-safe:
    the claim-ahead helper claims too)."""

    def __init__(self, layout: JobLayout, identity: WorkerIdentity):
        self.layout = layout
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        # the record carries the process's whole identity (node, host, boot, pid namespace, pid)
        self._record = PaceRecord(worker=worker_key(identity), seq=0, updated_at=time.time(), **asdict(identity))
        self._dirty = True
        self._dir_ready = False

    @property
    def key(self) -> str:
        return self._record.worker

    def holding(self, shard_id: str, generation: int, attempt_id: str) -> None:
        now = time.time()
        self._change(
            lambda r: replace(
                r,
                held=[*r.held, HeldClaim(shard_id, generation, attempt_id)],
                first_claimed_at=r.first_claimed_at if r.first_claimed_at is not None else now,
            )
        )

    def let_go(self, shard_id: str, generation: int) -> None:
        self._change(
            lambda r: replace(r, held=[h for h in r.held if (h.shard_id, h.generation) != (shard_id, generation)])
        )

    def finished(
        self, secs: float, rows: int, rows_in: int = 0, quarantined: int = 0, *, shard: HeldClaim | None = None
    ) -> None:
        """One accepted result of this process, ``secs`` on its own clock.  ``shard``: the claim it
        published, no longer listed as held in the same change, so a record never both counts a
        result and holds its claim: a reader counts a done shard that a record still holds from its
        done marker (``status.job_status``: the process died between its done marker and this)."""

        now = time.time()

        def add(r: PaceRecord) -> PaceRecord:
            held = [
                h for h in r.held if shard is None or (h.shard_id, h.generation) != (shard.shard_id, shard.generation)
            ]
            counts = dict(
                rows_out=r.rows_out + rows,
                rows_in=r.rows_in + rows_in,
                quarantined=r.quarantined + quarantined,
                last_done_at=now,
                held=held,
            )
            if r.done == 0:
                return replace(r, done=1, first_secs=secs, **counts)
            return replace(r, done=r.done + 1, warm_secs=r.warm_secs + secs, **counts)

        self._change(add)

    def _change(self, change) -> None:
        with self._lock:
            self._record = change(self._record)
            self._dirty = True

    def flush(self, *, stopped: bool = False) -> bool:
        """Write the record if it changed; errors are logged (a pace record is a hint)."""
        with self._write_lock:  # writes in seq order: an older record never lands last
            with self._lock:
                if stopped:
                    self._record = replace(self._record, held=[], stopped=True)
                    self._dirty = True
                if not self._dirty:
                    return False
                self._record = replace(self._record, seq=self._record.seq + 1, updated_at=time.time())
                record, self._dirty = self._record, False
            try:
                path = self.layout.pace(record.worker)
                if not self._dir_ready:
                    ensure_dir(self.layout, path.parent)
                    self._dir_ready = True
                fsio.atomic_write(path, record.encode(), durable=False)
            except (OSError, JobDirError) as exc:
                logger.warning(f"could not write this worker's pace record: {exc}")
                with self._lock:
                    self._dirty = True
                return False
            return True
