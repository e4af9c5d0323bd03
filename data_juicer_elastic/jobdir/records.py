"""Every record of the shard tasks and the job, and the encoding every record shares (the export's
records: ``exports``).  Every record is ``{"format": "dj-elastic/<kind>", "version": 1, ...}``; parsing
checks the tag, the version and every field's type (msgspec, strict), and anything malformed raises
:class:`JobDirError` naming the file (docs/job-dir-security.md).  Unknown extra fields are ignored, a
newer version is refused, and a reason code a newer writer used that this version does not know stays
the plain string."""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import re
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final, TypeVar

import msgspec

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.sharedfs import fsio

FORMAT_PREFIX: Final = "dj-elastic/"
VERSION: Final = 1


def canonical_json(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """Sorted keys, compact, UTF-8: the same value always gives the same bytes (hashes).
    ``default``: called for a value JSON has no type for (``json.dumps``' hook; it may raise)."""
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=default
    )
    return text.encode("utf-8")


R = TypeVar("R", bound="Record")


class _Head(msgspec.Struct):
    """What every record starts with, checked before its fields are: a foreign file is named as one."""

    format: Any = None
    version: Any = None


_HEAD: Final = msgspec.json.Decoder(_Head)
_MISSING: Final = re.compile(r"^Object missing required field `(\w+)`")
_AT: Final = re.compile(r"^(.*) - at `\$\.?(.*)`$")


class Record:
    """Base of every top-level record: ``encode()`` and ``Cls.parse(data, where)``."""

    KIND: ClassVar[str]
    COMPACT: ClassVar[bool] = False  # one line: for records rewritten or read every few seconds

    def to_dict(self) -> dict[str, Any]:
        body = dataclasses.asdict(self)  # type: ignore[call-overload]
        return {"format": FORMAT_PREFIX + self.KIND, "version": VERSION, **body}

    def encode(self) -> bytes:
        spacing: dict[str, Any] = {"separators": (",", ":")} if self.COMPACT else {"indent": 1}
        try:
            return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False, **spacing).encode("utf-8") + b"\n"
        except (TypeError, ValueError) as exc:  # a programming error, but name the record
            raise JobDirError(f"cannot encode {self.KIND} record: {exc}") from exc

    @classmethod
    def parse(cls: type[R], data: bytes, where: str | Path) -> R:
        where = str(where)
        try:
            head = _HEAD.decode(data)
            cls.check_head(head.format, head.version, where)
            return _decode(cls, lambda type_: _json_decoder(type_).decode(data))
        except (msgspec.MsgspecError, RecursionError) as exc:
            raise _corrupt(cls.KIND, exc, where) from None

    @classmethod
    def from_object(cls: type[R], obj: Any, where: str) -> R:
        """The record of ``obj``, a decoded JSON value (``parse`` without the decoding)."""
        if not isinstance(obj, dict):
            raise JobDirError(f"corrupt {cls.KIND} record: not a JSON object", where=where)
        cls.check_head(obj.get("format"), obj.get("version"), where)
        try:
            return _decode(cls, lambda type_: _convert(obj, type_))
        except (msgspec.MsgspecError, RecursionError) as exc:
            raise _corrupt(cls.KIND, exc, where) from None

    @classmethod
    def check_head(cls, tag: Any, version: Any, where: str) -> None:
        if tag != FORMAT_PREFIX + cls.KIND:
            raise JobDirError(
                f"not a dj-elastic {cls.KIND} record (format {tag!r})",
                where=where,
                hint="the job directory holds foreign or misplaced files; use a new job_dir",
            )
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise JobDirError(f"corrupt {cls.KIND} record: bad version {version!r}", where=where)
        if version > VERSION:
            raise JobDirError(
                f"{cls.KIND} record has version {version}; this dj-elastic reads version {VERSION}",
                where=where,
                hint="upgrade data-juicer-elastic on this node to the version that wrote the job",
            )

    @classmethod
    def read(cls: type[R], path: Path) -> R | None:
        """The record at ``path``; None when there is none; JobDirError when it is malformed."""
        data = fsio.read_record(path)
        return None if data is None else cls.parse(data, path)

    @classmethod
    def read_or_error(cls: type[R], path: Path) -> tuple[R | None, str | None]:
        """(record, None); (None, None) when there is none; (None, error) when it is malformed
        (oversized, a directory in its place, not JSON): one bad file must not stop every worker."""
        try:
            return cls.read(path), None  # type: ignore[attr-defined]
        except JobDirError as exc:
            return None, str(exc)


class ChecksummedRecord(Record):
    """A record whose ``checksum`` (last field) is the sha256 of the canonical record without it, written
    by ``encode()``: :meth:`parse_checked` refuses a flipped byte that still parses (a sha256 digit)."""

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        body.pop("checksum", None)
        body["checksum"] = record_checksum(body)
        return body

    @classmethod
    def parse_checked(cls: type[R], data: bytes, where: str | Path) -> R:
        record = cls.parse(data, where)
        actual = record_checksum(json.loads(data))
        if record.checksum != actual:  # type: ignore[attr-defined]
            raise JobDirError(
                f"{cls.KIND} record checksum mismatch: recorded {record.checksum}, content hashes to {actual}",  # type: ignore[attr-defined]
                where=str(where),
                hint="the record was modified or damaged after it was written",
            )
        return record


def _decode(cls: type[R], decode: Callable[[type], Any]) -> R:
    """``decode(cls)``; when a reason code is one this version does not know (msgspec refuses it), the
    record decoded with its codes as strings, each made its member where it names one."""
    try:
        return decode(cls)
    except msgspec.ValidationError as exc:
        twin, reasons = _lenient(cls)
        if not reasons or not str(exc).startswith("Invalid enum value"):
            raise
    values = vars(decode(twin))
    for name, codes in reasons.items():
        values[name] = codes._value2member_map_.get(values[name], values[name])
    return cls(**values)


# msgspec 0.19 caches a class's type info on the class while it builds it, unguarded: a thread decoding
# into a class that another thread is still building reads it half built (SIGSEGV; a worker's heartbeat
# and main threads both read claim records). So type info is built here only, one class at a time.
_BUILDING: Final = threading.Lock()


@functools.cache
def _json_decoder(type_: type) -> msgspec.json.Decoder:
    with _BUILDING:
        return msgspec.json.Decoder(type_, strict=True)


def _convert(obj: Any, type_: type) -> Any:
    _json_decoder(type_)  # msgspec.convert would build the type info itself, unlocked
    return msgspec.convert(obj, type_, strict=True)


@functools.cache  # built once per class; msgspec builds the twin's type info in _json_decoder, locked
def _lenient(cls: type) -> tuple[type, dict[str, type[enum.StrEnum]]]:
    """A twin of ``cls`` whose reason-code fields are strings, and those fields with their codes."""
    hints = typing.get_type_hints(cls)
    reasons = {}
    for name, hint in hints.items():
        codes = [t for t in (hint, *typing.get_args(hint)) if isinstance(t, type) and issubclass(t, enum.StrEnum)]
        if codes and not name.isupper():
            reasons[name] = codes[0]

    def as_decoded(name: str) -> Any:
        if name not in reasons:
            return hints[name]
        return str | None if type(None) in typing.get_args(hints[name]) else str

    fields = [
        (f.name, as_decoded(f.name), field(default=f.default, default_factory=f.default_factory))
        for f in dataclasses.fields(cls)
    ]
    return dataclasses.make_dataclass(cls.__name__, fields), reasons


def _corrupt(kind: str, exc: Exception, where: str) -> JobDirError:
    """The error of a record that is not JSON, or whose fields are not the record's (msgspec's words)."""
    text = str(exc) if not isinstance(exc, RecursionError) else "nested too deeply"
    if missing := _MISSING.match(text):
        text = f"missing field {missing[1]!r}"
    elif at := _AT.match(text):
        text = f"field {at[2]!r} has unexpected value ({at[1][:1].lower()}{at[1][1:]})"
    elif text.startswith("Expected `object`"):
        text = "not a JSON object"
    return JobDirError(f"corrupt {kind} record: {text}", where=where)


@dataclass(frozen=True)
class InputFile:
    path: str  # absolute path as given at prepare time
    relpath: str  # POSIX path relative to the dataset root (file name for single-file input)
    sha256: str | None  # of the whole file; None in planned jobs (each shard's spans are hashed instead)
    size: int
    mtime_ns: int
    rows: int
    codec: str = "none"  # how the file is stored: "none" | "gzip" | "zstd" (rows.codecs)


@dataclass(frozen=True)
class ShardSpan:
    """Bytes ``[offset, offset + length)`` of input file ``input`` (an index into the job's inputs).
    A compressed input is one span covering the whole stored file (docs/input-format.md)."""

    input: int
    offset: int
    length: int
    rows: int | None = None  # rows in the span, once scanned (the manifest's spans; None in the plan)


@dataclass(frozen=True)
class ShardEntry:
    shard_id: str
    index: int
    first_row: int  # global 0-based index of the shard's first row
    rows: int
    bytes: int  # content bytes (what sha256 covers and readers check; docs/input-format.md)
    sha256: str  # of the content
    stored_bytes: int | None = None  # of the copied file as stored, when a shard codec compresses it
    stored_sha256: str | None = None
    spans: list[ShardSpan] = field(default_factory=list)  # where the content is in the inputs
    normalise: bool = False  # a reader must normalise its rows (rows.jsonl.RowNormaliser)

    @property
    def span_bytes(self) -> int:
        """The sum of its spans' lengths (the stored bytes it reads; ``manifest.ShardRow`` has it too)."""
        return sum(span.length for span in self.spans)

    def stored(self) -> tuple[int, str]:
        """(size, sha256) of the shard file on disk."""
        if self.stored_bytes is None or self.stored_sha256 is None:
            return self.bytes, self.sha256
        return self.stored_bytes, self.stored_sha256


@dataclass(frozen=True)
class ScanSummary:
    """The scan phase of a planned job, kept in its manifest (status and the report read it there)."""

    planned_at: float  # the plan's creation: the job's submission
    started_at: float  # the first scan's start
    finished_at: float  # the last accepted scan's end
    bytes_read_to_plan: int  # what the planner read to place the cuts


@dataclass(frozen=True)
class Manifest(ChecksummedRecord):
    KIND: ClassVar[str] = "manifest"
    job_id: str
    created_at: float
    dataset_path: str
    dataset_kind: str  # "file" | "directory"
    inputs: list[InputFile]
    num_shards: int
    total_rows: int
    total_bytes: int
    content_sha256: str  # the job's input as one digest (manifest.compose_manifest)
    recipe_hash: str
    recipe: dict[str, Any]
    stage_identities: list[str]
    media_keys: dict[str, str]
    index_key: str | None
    versions: dict[str, str]
    ray: dict[str, Any]
    settings: dict[str, Any]
    shards: list[ShardEntry]
    request_fingerprint: str
    shard_codec: str = "none"  # how shard files are stored: "none" | "gzip" | "zstd" (codecs.SHARD_SUFFIX)
    copy_shards: bool = True  # shards are files in shards/; False: read from their spans of the inputs
    # the JSON types of every input row (RowSchema.to_json()): every shard is read with this one schema;
    # None in jobs prepared before it existed (workers refuse them)
    row_schema: list[Any] | None = None
    code: dict[str, Any] | None = None  # fingerprint of the code the stages run (execution.code_fingerprint)
    scan: ScanSummary | None = None  # the scan phase (None: the job was split by a whole-input prepare)
    checksum: str | None = None  # ChecksummedRecord: a flipped byte that still parses is refused before any claim

    @property
    def shard_ids(self) -> list[str]:
        return [entry.shard_id for entry in self.shards]

    def shard(self, shard_id: str) -> ShardEntry:
        for entry in self.shards:
            if entry.shard_id == shard_id:
                return entry
        raise JobDirError(
            f"unknown shard {shard_id!r}: this job has {self.num_shards} shards",
            where="shard id",
            hint=f"valid ids run from {self.shards[0].shard_id} to {self.shards[-1].shard_id}",
        )


def record_checksum(obj: dict[str, Any]) -> str:
    """The checksum a checksummed record object (as written, extra fields included) must carry."""
    return hashlib.sha256(canonical_json({k: v for k, v in obj.items() if k != "checksum"})).hexdigest()


class TakeoverReason(enum.StrEnum):
    """Why generation N of a shard could be claimed over (``Claim.takeover_reason``)."""

    FIRST = "none"  # the first claim of the shard
    RELEASED = "released"  # its holder released it
    FAILED = "failed"  # a failure record exists for it
    STALE = "stale"  # its heartbeat did not change for a TTL on the claimer's clock
    HOLDER_DEAD = "dead-pid"  # its holder's pid is gone in the claimer's own kernel and pid namespace
    RETRY = "retry"  # `dj-elastic retry` requeued the shard (jobdir.retry)


class ReleaseReason(enum.StrEnum):
    """Why a holder gave its generation up (``Release.reason``)."""

    FINISHED = "finished"  # the shard is published (by us or by another attempt): free only once stale
    FAILED = "failed"  # the attempt failed (a failure record exists too)
    SIGNAL = "signal"  # SIGTERM/SIGINT
    ABANDONED = "abandoned"  # the lease was lost: the attempt did not publish
    RETRY = "retry"  # `dj-elastic retry` requeued the shard
    WORKER_FAULT = "worker-fault"  # this worker cannot run shards (its set-up, not the shard)
    STALLED = "stalled"  # the attempt showed no sign of life for the stall timeout
    UNRUN = "unrun"  # claimed ahead and handed back without running (jobdir.claiming.ClaimAhead)
    LEFT = "left"  # the job summary's writer is leaving (jobdir.roles): the next may write at once


class FailureReason(enum.StrEnum):
    """Why a generation failed (``Failure.exit_reason``)."""

    ERROR = "error"  # the shard's execution raised: counts against max_retries
    LEASE_EXPIRED = "lease-expired"  # its holder stopped renewing (killed, lost, hung)
    HOLDER_DEAD = "holder-dead"  # its holder's pid vanished on the observer's host
    STALLED = "stalled"  # its attempt showed no sign of life for the stall timeout


# Failures whose holder died or stopped: evidence against the node, not the shard, so they have a
# budget of their own (max_holder_deaths); every other failure counts against max_retries.
DEATH_REASONS: Final = frozenset({FailureReason.LEASE_EXPIRED, FailureReason.HOLDER_DEAD, FailureReason.STALLED})


class AttemptExit(enum.StrEnum):
    """How an attempt ended (``AttemptRecord.exit_reason``)."""

    DONE = "done"  # its result is the shard's accepted result
    DISCARDED = "discarded"  # finished, but another attempt had published first
    FAILED = "failed"  # the shard's processing failed
    LOST = "lost"  # the lease was lost: abandoned without publishing
    SIGNAL = "signal"  # interrupted by SIGTERM/SIGINT (or SystemExit)
    WORKER_FAULT = "worker-fault"  # this worker cannot run shards


class StopReason(enum.StrEnum):
    """Why a worker loop returned (``WorkerSummary.stop_reason``; empty until it stops)."""

    FINISHED = "finished"  # every shard is done or failed for good
    MAX_SHARDS = "max_shards"  # it claimed its max_shards
    MAX_DONE = "max_done"  # its max_done results were accepted (strict mode's share)
    NO_WORK = "no_work"  # nothing claimable and not waiting for completion
    STOPPED = "stopped"  # its stop event was set
    INTERRUPTED = "interrupted"  # a signal whose previous handler chose not to exit


@dataclass(frozen=True)
class Claim(Record):
    KIND: ClassVar[str] = "claim"
    shard_id: str
    generation: int
    attempt_id: str
    node_id: str
    hostname: str
    boot_id: str
    pid: int
    pid_namespace: str
    claimed_at: float  # wall clock, informational only (never compared across nodes)
    takeover_of: int  # generation taken over (0 for the first claim)
    takeover_reason: TakeoverReason


@dataclass(frozen=True)
class Heartbeat(Record):
    KIND: ClassVar[str] = "heartbeat"
    shard_id: str
    generation: int
    attempt_id: str
    seq: int  # strictly increasing; observers watch it change, not the clock
    written_at: float  # wall clock, informational only


@dataclass(frozen=True)
class Release(Record):
    KIND: ClassVar[str] = "release"
    shard_id: str
    generation: int
    attempt_id: str
    reason: ReleaseReason
    released_at: float


@dataclass(frozen=True)
class Failure(Record):
    KIND: ClassVar[str] = "failure"
    shard_id: str
    generation: int
    attempt_id: str
    node_id: str
    hostname: str
    pid: int
    error: str
    error_type: str
    exit_reason: FailureReason  # DEATH_REASONS have a budget of their own
    failed_at: float


@dataclass(frozen=True)
class AttemptRecord(Record):
    KIND: ClassVar[str] = "attempt"
    shard_id: str
    attempt_id: str
    generation: int
    node_id: str
    hostname: str
    boot_id: str
    pid: int
    started_at: float
    ended_at: float | None = None
    rows: int | None = None
    exit_reason: AttemptExit | None = None
    error: str | None = None
    batching: dict[str, Any] | None = None  # attempt_dir/batching.json, folded in when the attempt ends
    # rows operators failed on that the attempt set aside (quarantine; errors.jsonl), when it published
    quarantined: int | None = None


@dataclass(frozen=True)
class RowStatsFile:
    """An attempt's per-row stats file (jobdir.exports): one line per output row."""

    path: str  # relative to the job directory
    bytes: int
    sha256: str


@dataclass(frozen=True)
class RowErrorsFile:
    """An attempt's quarantined rows (jobdir.exports): one line per row an operator failed on."""

    path: str  # relative to the job directory
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ShardResult(Record):
    KIND: ClassVar[str] = "result"
    shard_id: str
    attempt_id: str
    generation: int
    node_id: str
    rows: int
    bytes: int
    sha256: str
    output: str  # path of the output file relative to the job directory
    input_rows: int
    input_sha256: str
    published_at: float
    # the output's per-shard stats summary (relative path, sha256 of its bytes); None when the runner wrote none
    stats: str | None = None
    stats_sha256: str | None = None
    row_stats: RowStatsFile | None = None  # jobdir.exports; None when the recipe makes no stats or meta
    errors: RowErrorsFile | None = None  # jobdir.exports; None when no row was quarantined


@dataclass(frozen=True)
class TerminalFailure(Record):
    KIND: ClassVar[str] = "terminal-failure"
    shard_id: str
    failures: int
    max_retries: int
    last_error: str
    last_attempt_id: str
    generations: list[int]
    failed_at: float
    max_holder_deaths: int | None = None  # the death budget in force (None: unlimited, or an older writer)


@dataclass(frozen=True)
class PlannedInput:
    path: str  # absolute path as given at prepare time
    relpath: str  # POSIX path relative to the dataset root (file name for single-file input)
    codec: str  # "none" | "gzip" | "zstd" (rows.codecs)
    size: int  # bytes as stored when planned
    mtime_ns: int


@dataclass(frozen=True)
class PlannedShard:
    shard_id: str
    index: int
    spans: list[ShardSpan]
    bytes: int  # stored bytes of the spans (what the plan balanced)


@dataclass(frozen=True)
class JobPlan(ChecksummedRecord):
    """Everything prepare decides without reading the data (``plan.json``)."""

    KIND: ClassVar[str] = "plan"
    job_id: str
    created_at: float
    dataset_path: str
    dataset_kind: str  # "file" | "directory"
    inputs: list[PlannedInput]
    num_shards: int
    recipe_hash: str
    recipe: dict[str, Any]
    stage_identities: list[str]
    media_keys: dict[str, str]
    index_key: str | None
    versions: dict[str, str]
    ray: dict[str, Any]
    settings: dict[str, Any]
    shards: list[PlannedShard]
    request_fingerprint: str
    max_line_bytes: int
    shard_codec: str = "none"  # how copied shards are stored (copy_shards only)
    copy_shards: bool = False  # scans copy each shard into shards/ (else: shards are byte ranges of the inputs)
    code: dict[str, Any] | None = None  # fingerprint of the operator code (execution.code_fingerprint)
    planned_bytes_read: int = 0  # bytes the planner read to place the cuts (serial work, for the report)
    # the recipe's export_path at prepare, absolute: where ``dj-elastic merge`` writes without --output
    # (not part of the job's identity: a later run may export the same shards elsewhere)
    export_path: str | None = None
    checksum: str | None = None

    @property
    def shard_ids(self) -> list[str]:
        return [entry.shard_id for entry in self.shards]

    @property
    def total_bytes(self) -> int:
        return sum(entry.bytes for entry in self.shards)


@dataclass(frozen=True)
class ScanRefusal:
    """Why a scan refused its shard's input: a row (``line``, 1-based within span ``span``) or a
    whole file (``line`` None: corrupt compression, changed since planning)."""

    span: int
    line: int | None
    message: str
    hint: str | None
    error_type: str  # "InputError" | "InputChangedError"


@dataclass(frozen=True)
class ScanResult(ChecksummedRecord):
    """One shard's scan, published at ``scans/done/<shard>.json`` (first wins)."""

    KIND: ClassVar[str] = "scan"
    shard_id: str
    attempt_id: str
    generation: int
    node_id: str
    rows: int
    bytes: int  # the shard's content bytes (docs/input-format.md)
    sha256: str  # of the content
    span_rows: list[int]  # rows of each span, in order (line numbers of errors, rows per input file)
    schema: list[Any]  # rows.row_schema.RowSchema.to_json() of the shard's rows
    normalise: bool  # some row needs normalising when read (rows.jsonl: media paths, index key, blanks, CRLF, BOM)
    longest_line: int  # bytes of the longest line (without its newline)
    started_at: float
    finished_at: float
    refusal: ScanRefusal | None = None  # set: the input is refused, the job must not run
    copy: str | None = None  # copy_shards: the copy inside the scan attempt's directory (relative to the job dir)
    stored_bytes: int | None = None  # of the copy as stored, when a shard codec compresses it
    stored_sha256: str | None = None
    checksum: str | None = None
