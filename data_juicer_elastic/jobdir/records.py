"""Versioned on-disk records: the encode/parse machinery every kind shares, and the manifest.

Every record is ``{"format": "dj-elastic/<kind>", "version": 1, ...}``; parsing checks the tag, the
version and every field's type, and anything malformed raises :class:`JobDirError` naming the file
(docs/job-dir-security.md).  Unknown extra fields are ignored, a newer version is refused, and a
reason code a newer writer used that this version does not know stays the plain string.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final, TypeVar, Union

from data_juicer_elastic.errors import ConfigError, JobDirError, clip
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


def manifest_recipe_hash(recipe: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a recipe dict as the manifest holds it (the job's recipe
    identity; ``integration.recipe.recipe_hash`` canonicalises a built recipe, then calls this)."""
    try:
        return hashlib.sha256(canonical_json(recipe)).hexdigest()
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the recipe is not plain JSON data: {exc}",
            where="recipe",
            hint="recipe values must be str, int, float, bool, None, lists and dicts",
        ) from exc


R = TypeVar("R", bound="Record")


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
            obj = json.loads(data, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise JobDirError(f"corrupt {cls.KIND} record: {exc}", where=where) from None
        return cls.from_object(obj, where)

    @classmethod
    def from_object(cls: type[R], obj: Any, where: str) -> R:
        """The record of ``obj``, a decoded JSON value (``parse`` without the decoding)."""
        if not isinstance(obj, dict):
            raise JobDirError(f"corrupt {cls.KIND} record: not a JSON object", where=where)
        tag = obj.get("format")
        if tag != FORMAT_PREFIX + cls.KIND:
            raise JobDirError(
                f"not a dj-elastic {cls.KIND} record (format {tag!r})",
                where=where,
                hint="the job directory holds foreign or misplaced files; use a new job_dir",
            )
        version = obj.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise JobDirError(f"corrupt {cls.KIND} record: bad version {version!r}", where=where)
        if version > VERSION:
            raise JobDirError(
                f"{cls.KIND} record has version {version}; this dj-elastic reads version {VERSION}",
                where=where,
                hint="upgrade data-juicer-elastic on this node to the version that wrote the job",
            )
        return _build(cls, obj, where, cls.KIND)

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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _build(cls: type, obj: dict[str, Any], where: str, kind: str) -> Any:
    values: dict[str, Any] = {}
    for name, optional, check in _field_checks(cls):
        if name not in obj:
            if optional:
                continue
            raise JobDirError(f"corrupt {kind} record: missing field {name!r}", where=where)
        values[name] = check(obj[name], where, kind, name)
    return cls(**values)


FieldCheck = Callable[[Any, str, str, str], Any]  # (value, where, kind, field name) -> the value as the field holds it


@functools.cache
def _field_checks(cls: type) -> tuple[tuple[str, bool, FieldCheck], ...]:
    """Each field of a record class: (name, may be absent, its check), built once per class: every
    lease read parses records, and choosing a check from a type hint costs more than the check."""
    hints = typing.get_type_hints(cls)  # evaluates the (string) annotations
    return tuple(
        (
            f.name,
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
            _check_for(hints[f.name]),
        )
        for f in dataclasses.fields(cls)
    )


def _bad(value: Any, where: str, kind: str, name: str) -> JobDirError:
    return JobDirError(
        f"corrupt {kind} record: field {name!r} has unexpected value {clip(repr(value), 80)}", where=where
    )


def _exactly(*types_: type) -> FieldCheck:
    """A value of one of ``types_`` (never a bool for a number), as it is."""

    def check(value: Any, where: str, kind: str, name: str) -> Any:
        if isinstance(value, types_) and (bool in types_ or not isinstance(value, bool)):
            return value
        raise _bad(value, where, kind, name)

    return check


@functools.cache
def _check_for(hint: Any) -> FieldCheck:
    origin = typing.get_origin(hint)
    if hint is str or hint is int or hint is bool or hint is type(None):
        return _exactly(hint)
    if hint is Any:
        return lambda value, where, kind, name: value
    if isinstance(hint, type) and issubclass(hint, enum.StrEnum):
        strings = _exactly(str)
        return lambda value, where, kind, name: _reason(hint, strings(value, where, kind, name))
    if hint is float:
        number = _exactly(int, float)
        return lambda value, where, kind, name: float(number(value, where, kind, name))
    if origin in (Union, types.UnionType):
        options = [_check_for(option) for option in typing.get_args(hint)]
        optional = type(None) in typing.get_args(hint)

        def check_union(value: Any, where: str, kind: str, name: str) -> Any:
            if value is None and optional:  # not after a failed check of each other option (an exception each)
                return None
            for option in options:
                try:
                    return option(value, where, kind, name)
                except JobDirError:
                    continue
            raise _bad(value, where, kind, name)

        return check_union
    if origin is list:
        (item_hint,) = typing.get_args(hint)
        item = _check_for(item_hint)

        def check_list(value: Any, where: str, kind: str, name: str) -> Any:
            if not isinstance(value, list):
                raise _bad(value, where, kind, name)
            return [item(v, where, kind, f"{name}[{i}]") for i, v in enumerate(value)]

        return check_list
    if origin is dict or hint is dict:
        args = typing.get_args(hint)
        entry = _check_for(args[1]) if args else None

        def check_dict(value: Any, where: str, kind: str, name: str) -> Any:
            if not isinstance(value, dict):
                raise _bad(value, where, kind, name)
            return value if entry is None else {k: entry(v, where, kind, f"{name}.{k}") for k, v in value.items()}

        return check_dict
    if dataclasses.is_dataclass(hint):

        def check_record(value: Any, where: str, kind: str, name: str) -> Any:
            if not isinstance(value, dict):
                raise _bad(value, where, kind, name)
            return _build(hint, value, where, kind)

        return check_record
    raise TypeError(f"unsupported record field type {hint!r}")  # pragma: no cover - programming error


def _reason(codes: type[enum.StrEnum], value: str) -> Any:
    """The member ``value`` names, or ``value`` itself when a newer writer used a code we do not know."""
    try:
        return codes(value)
    except ValueError:
        return value


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
    A compressed input is one span covering the whole stored file (``jobdir.plan_records``)."""

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
    bytes: int  # content bytes (what sha256 covers and readers check; jobdir.plan_records)
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
    content_sha256: str  # the job's input as one digest (jobdir.scans)
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
