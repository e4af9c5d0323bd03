"""The export and the files beside every shard's rows.  The export: its records (``merge.json``, a
parts export's index, ``clean.json``), where a merge may write (checked before anything is written;
the refused cases: docs/output-layouts.md; never through a link: docs/job-dir-security.md), the files
an accepted attempt published (re-checked by one reader, so the rules cannot drift), and the export
files this job itself wrote, which a merge may replace without ``overwrite`` (``merge.json`` proves
them by sha256; anything else there still needs it).  The side files of a shard's rows: the per-row
stats file (each output row's ``__dj__stats__`` / ``__dj__meta__``: Data-Juicer's
``<export>_stats.jsonl`` layout, docs/analysis.md) and the quarantine file (each row an operator
failed on, with why: docs/quarantine.md); each attempt writes its shard's lines, the result record
names the file with its size and sha256, and merge concatenates the accepted files in manifest
order beside the export, validated like the outputs.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

import orjson

from data_juicer_elastic.errors import ConfigError, IntegrityError, JobDirError, Places, preview
from data_juicer_elastic.jobdir.layout import JobLayout, check_inside
from data_juicer_elastic.jobdir.records import Record, RowErrorsFile, RowStatsFile, ShardEntry, ShardResult
from data_juicer_elastic.rows.jsonl import validate_jsonl_output
from data_juicer_elastic.sharedfs import fsio

# The names a parts export holds (shards.parts writes them; Data-Juicer's loaders take only the
# parts as data: docs/output-layouts.md).  The index is written last: its presence means complete.
PARTS_INDEX: Final = "_index.dj-elastic"
PART_STATS_SUFFIX: Final = ".stats"
_PARTS_ENTRY: Final = re.compile(r"^part-\d{5}-of-\d{5}(\.jsonl|\.stats|\.errors)$")


def part_name(shard_id: str) -> str:
    """``part-00003-of-00016.jsonl``: a shard's part (name order is input order)."""
    return shard_id + ".jsonl"


def part_stats_name(shard_id: str) -> str:
    """``part-00003-of-00016.stats``: the part's per-row stats (JSONL, a suffix no loader takes as data)."""
    return shard_id + PART_STATS_SUFFIX


def part_errors_name(shard_id: str) -> str:
    """``part-00003-of-00016.errors``: the rows operators failed on in that shard (quarantine; JSONL)."""
    return shard_id + ".errors"


def is_parts_entry(name: str) -> bool:
    """Whether a parts export may hold a file of this name (a part, its stats, the index)."""
    return name == PARTS_INDEX or bool(_PARTS_ENTRY.match(name))


@dataclass(frozen=True)
class MergedShard:
    shard_id: str
    attempt_id: str
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class MergeRecord(Record):
    KIND: ClassVar[str] = "merge"
    output_path: str
    rows: int
    bytes: int
    sha256: str
    job_id: str
    content_sha256: str  # of the manifest's input, to tie the output to the job
    shards: list[MergedShard] = field(default_factory=list)
    merged_at: float = 0.0
    # <export>_stats.jsonl (jobdir.exports), when the recipe makes per-row stats
    row_stats_path: str | None = None
    row_stats_sha256: str | None = None
    # <export>_errors.jsonl (jobdir.exports): the quarantined rows; 0 and None when there were none
    errors_rows: int = 0
    errors_path: str | None = None
    errors_sha256: str | None = None
    # "file": output_path is the merged JSONL and sha256 its hash; "parts": output_path is the
    # export directory and sha256 the hash of its index file (PartsIndex), which names every part
    layout: str = "file"
    # each deduplicator: stage, op, position, rows reaching it, rows it dropped (dedup.phase_progress)
    dedup: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ExportPart:
    """One part of a parts export: a shard's accepted output (and its per-row stats file)."""

    name: str  # part-00003-of-00016.jsonl, in the export directory
    shard_id: str
    attempt_id: str
    rows: int
    bytes: int
    sha256: str
    stats_name: str | None = None  # part-00003-of-00016.stats; None when the recipe makes no per-row stats
    stats_bytes: int | None = None
    stats_sha256: str | None = None
    errors_name: str | None = None  # part-00003-of-00016.errors; None when no row of the shard was quarantined
    errors_rows: int | None = None
    errors_bytes: int | None = None
    errors_sha256: str | None = None


@dataclass(frozen=True)
class PartsIndex(Record):
    """``<export>/_index.dj-elastic``: the parts in input order, written last (its presence means
    complete).  No timestamps: the same job always gives the same bytes."""

    KIND: ClassVar[str] = "parts-index"
    job_id: str
    content_sha256: str  # of the manifest's input, to tie the export to the job
    num_parts: int
    rows: int
    bytes: int
    parts: list[ExportPart] = field(default_factory=list)


@dataclass(frozen=True)
class CleanRecord(Record):
    """``clean.json``: written before the first shard output is removed, so a clean killed half-way
    leaves a job every reader already treats as cleaned (docs/output-layouts.md)."""

    KIND: ClassVar[str] = "clean"
    job_id: str
    output_path: str  # the export merge.json names, verified before anything was removed
    layout: str  # its layout: "file" or "parts"
    merge_sha256: str  # merge.json's sha256 then: of the merged file, or of the parts index
    started_at: float
    complete: bool = False  # every reclaimable file removed (False: a clean was stopped; run it again)
    files: int = 0  # removed, once complete
    bytes_freed: int = 0  # the sizes of the removed files that had no other name


def cleaned_error(layout: JobLayout, record: CleanRecord, needs: str) -> JobDirError:
    """The refusal of a step that needs the shard outputs ``record`` says were removed."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.started_at))
    return JobDirError(
        f"the shard outputs of this job were cleaned ({when}); {needs} needs them",
        where=str(layout.root),
        hint=f"the job's export is {record.output_path} (`dj-elastic verify` checks it); to run shards again, "
        "run the recipe with a new job_dir",
    )


def export_target(path: str | os.PathLike) -> Path:
    """``path`` made absolute (``~`` expanded) without resolving its last component."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def inside(directory: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether ``path`` (its parent's real path, its own name) lies in or at ``directory``."""
    root = os.path.realpath(os.path.abspath(os.path.expanduser(os.fspath(directory))))
    at = export_target(path)
    target = os.path.join(os.path.realpath(at.parent), at.name)  # a link *at* the path is not followed
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def merge_places(job_dir: str | os.PathLike, export_path: str | os.PathLike, *args: object, **kwargs: object) -> Places:
    """Where a merge reads and writes, for a storage error's hint (``errors.storage_error``): the
    job directory, then the export location (the folder of the merged output and its siblings).
    Takes a merge's own arguments, so it can be given to ``errors.storage_errors`` as is."""
    return (("job directory", job_dir), ("export location", export_target(export_path).parent))


def check_export_path(
    job_dir: str | os.PathLike, path: str | os.PathLike, key: str = "export_path", layout: str = "file"
) -> Path:
    """The export path to write (see :func:`export_target`); ConfigError naming ``key`` when it
    lies inside the job directory, or is a directory (``layout`` file), or is not a place a
    parts export may be published (``layout`` parts: :func:`check_parts_target`)."""
    target = export_target(path)
    if inside(job_dir, target):
        raise ConfigError(
            f"{target} is inside the job directory {job_dir}: the merge would overwrite the job's own files",
            where=key,
            hint="choose a path outside the job directory",
        )
    if layout == "parts":
        check_parts_target(job_dir, target, key)
        return target
    if target.is_dir() and not target.is_symlink():
        raise ConfigError(
            f"{target} is a directory; the merged output is one JSONL file",
            where=key,
            hint="name the file to write, e.g. <that directory>/merged.jsonl, or set elastic.export_layout: parts",
        )
    return target


def check_parts_target(job_dir: str | os.PathLike, target: Path, key: str) -> None:
    """ConfigError unless ``target`` is absent, an empty directory, or a directory holding only
    what a parts export holds (an earlier export: whether it is this job's is decided when it is
    published); never a link, a file, or a directory that holds the job directory."""
    if inside(target, job_dir):
        raise ConfigError(
            f"the job directory {job_dir} is inside the export directory {target}: Data-Juicer's loaders would "
            "read the job's files as data",
            where=key,
            hint="choose an export directory outside the job directory, and not above it",
        )
    if os.path.islink(target):
        raise ConfigError(
            f"a symlink is at the export path (to {os.readlink(target)}); a parts export is never written through it",
            where=key,
            hint="remove the link, or name a directory that is not a link",
        )
    if not os.path.lexists(target):
        return
    if not target.is_dir():
        raise ConfigError(
            f"{target} is a file; export_layout parts publishes a directory of part files there",
            where=key,
            hint="name a new or empty directory (e.g. <that path>-parts), or set elastic.export_layout: file",
        )
    foreign = sorted(name for name in os.listdir(target) if not is_parts_entry(name))
    if foreign:
        raise ConfigError(
            f"{target} holds files a parts export never writes ({preview(foreign)}); it is published only into an "
            "empty directory or over an earlier parts export, and never removes files it did not write",
            where=key,
            hint="name a new or empty directory",
        )


def check_recipe_paths(job_dir: str | os.PathLike, paths: Mapping[str, str | None], layout: str = "file") -> None:
    """Refuse Data-Juicer output paths of a recipe (export_path, work_dir, ...) inside the job
    directory (or, for a parts export, inside the export directory), before Data-Juicer's set-up
    creates any of them there."""
    export = paths.get("export_path")
    parts = export if layout == "parts" and export and "://" not in str(export) else None
    for key, value in paths.items():
        if not value or "://" in str(value):  # unset, or a remote (s3://...) path: not on this filesystem
            continue
        if key == "export_path":
            check_export_path(job_dir, value, key, layout)
        elif inside(job_dir, value):
            raise ConfigError(
                f"{export_target(value)} is inside the job directory {job_dir}: Data-Juicer would write its "
                "logs and records there",
                where=key,
                hint="choose a directory outside the job directory",
            )
        elif parts is not None and inside(parts, value):
            raise ConfigError(
                f"{export_target(value)} is inside the export directory {export_target(parts)}: Data-Juicer "
                "would write its logs and records among the parts",
                where=key,
                hint="choose a directory outside the export directory",
            )


FORGED_HINT = "the job directory was modified; prepare a new job_dir"


def locate_published_file(
    layout: JobLayout, entry: ShardEntry, result: ShardResult, *, what: str, relative: str, requeue: str
) -> Path:
    """The path of a file a done marker names, without reading it: inside the attempt's own
    directory, reached through no link out of the job directory, and present; IntegrityError
    naming the shard otherwise (publication of a parts export checks this much, and the size)."""
    where = f"shard {entry.shard_id}"
    try:
        path = layout.resolve_relative(relative)
        own = layout.attempt_dir(entry.shard_id, result.attempt_id)
    except JobDirError as exc:
        raise IntegrityError(f"bad {what} path {relative!r}: {exc.message}", where=where, hint=FORGED_HINT) from None
    if own not in path.parents:  # publish_done only accepts files there; anything else is forged
        raise IntegrityError(
            f"done marker names {what} {relative}, outside its attempt directory {layout.relative(own)}",
            where=where,
            hint=FORGED_HINT,
        )
    if not fsio.exists(path):
        raise IntegrityError(f"accepted {what} {path} is missing", where=where, hint=requeue)
    check_inside(layout, path)  # a record may not lead the merge out through a planted link
    return path


def check_published_file(
    layout: JobLayout,
    entry: ShardEntry,
    result: ShardResult,
    *,
    what: str,
    relative: str,
    expected: tuple[int, int, str],
    requeue: str,
    sink: Callable[[bytes], None] | None = None,
) -> Path:
    """The file's path once its (rows, bytes, sha256) equal ``expected``; IntegrityError naming the
    shard.  ``what``: the kind of file, for messages; ``requeue``: the hint for a missing, corrupt or
    edited file; ``sink`` receives the file in blocks of whole, validated lines (merge copies)."""
    where = f"shard {entry.shard_id}"
    path = locate_published_file(layout, entry, result, what=what, relative=relative, requeue=requeue)
    try:
        found = validate_jsonl_output(path, str(path), sink)
    except ValueError as exc:
        raise IntegrityError(f"accepted {what} is corrupt: {exc}", where=where, hint=requeue) from None
    if tuple(found) != tuple(expected):
        rows, size, sha = expected
        raise IntegrityError(
            f"accepted {what} does not match its record: expected rows={rows} bytes={size} sha256={sha}, "
            f"found rows={found[0]} bytes={found[1]} sha256={found[2]}",
            where=where,
            hint=f"{path} was modified after publication; {requeue}",
        )
    return path


def recorded_files(layout: JobLayout) -> dict[Path, str]:
    """{path: sha256} of the export files the last merge wrote (a one-file export: the output, its
    row stats, its quarantine file); empty without a readable record or for a parts export."""
    try:
        record = MergeRecord.read(layout.merge_record)
    except JobDirError:  # a damaged record proves nothing
        return {}
    if record is None or record.layout != "file":
        return {}
    pairs = [
        (record.output_path, record.sha256),
        (record.row_stats_path, record.row_stats_sha256),
        (record.errors_path, record.errors_sha256),
    ]
    return {Path(path): sha for path, sha in pairs if path and sha}


def written_by_job(layout: JobLayout, path: Path, recorded: dict[Path, str] | None = None) -> bool:
    """Whether the regular file at ``path`` is byte for byte the one this job's last merge wrote there
    (one read of it)."""
    sha = (recorded_files(layout) if recorded is None else recorded).get(Path(path))
    if sha is None or os.path.islink(path) or not os.path.isfile(path):
        return False
    try:
        return fsio.file_sha256(Path(path))[1] == sha
    except OSError:
        return False


def export_changed(layout: JobLayout) -> Path | None:
    """The first export file the last merge wrote that is no longer what it wrote (None: each is
    as written, or gone), so the next merge could not replace it without ``overwrite``."""
    recorded = recorded_files(layout)
    for path in recorded:
        if (os.path.lexists(path)) and not written_by_job(layout, path, recorded):
            return path
    return None


ROW_STATS_FILE: Final = "row-stats.jsonl"  # an attempt's per-row stats file, in its attempt directory
ERRORS_FILE: Final = "errors.jsonl"  # an attempt's quarantine file, in its attempt directory
# Ray workers append their raw records here (one file per process); the runner folds them into ERRORS_FILE.
WORKER_DIR: Final = "quarantine"
ROW_KEY: Final = "row"  # always the last key of a line of the quarantine file: the row's own bytes end it
# The two columns of a row that go to the row stats file, as Data-Juicer names them
# (``data_juicer.utils.constant.Fields.stats`` / ``Fields.meta``; not imported: no Data-Juicer here).
STATS_FIELD: Final = "__dj__stats__"
META_FIELD: Final = "__dj__meta__"


def export_stats_path(export: Path) -> Path:
    """``merged.jsonl`` -> ``merged_stats.jsonl`` (Data-Juicer's name for it)."""
    return export_side_path(export, "_stats.jsonl")


def export_errors_path(export: Path) -> Path:
    """``merged.jsonl`` -> ``merged_errors.jsonl`` (named like Data-Juicer's ``_stats.jsonl``)."""
    return export_side_path(export, "_errors.jsonl")


def export_side_path(export: Path, suffix: str) -> Path:
    """A file beside the export: its name with ``.jsonl`` (or ``.json``) replaced by ``suffix``."""
    name = export.name
    for ending in (".jsonl", ".json"):
        if name.endswith(ending) and len(name) > len(ending):
            return export.with_name(name[: -len(ending)] + suffix)
    return export.with_name(name + suffix)


def _checked_lines(path: Path, what: str, shard: str) -> tuple[int, int, str]:
    """(lines, bytes, sha256) of an attempt's side file, made durable and checked as valid JSONL."""
    fsio.fsync_file(path)
    try:
        return validate_jsonl_output(path, str(path))
    except ValueError as exc:
        raise IntegrityError(f"invalid {what}: {exc}", where=f"shard {shard}") from None


def describe_row_stats(layout: JobLayout, path: Path, rows: int, shard: str) -> RowStatsFile:
    """The record of an attempt's row stats file, made durable and checked: one line per output row."""
    lines, size, sha = _checked_lines(path, "row stats file", shard)
    if lines != rows:
        raise IntegrityError(f"the row stats file has {lines} lines for {rows} output rows", where=f"shard {shard}")
    return RowStatsFile(layout.relative(path), size, sha)


def describe_row_errors(layout: JobLayout, path: Path, shard: str) -> RowErrorsFile:
    """The record of an attempt's quarantine file, made durable and checked."""
    return RowErrorsFile(layout.relative(path), *_checked_lines(path, "quarantine file", shard))


@dataclass(frozen=True)
class MergedSideFile:
    """A file the merge published beside the export: this one (``<export>_stats.jsonl``) or the
    quarantine file (``<export>_errors.jsonl``)."""

    path: Path
    rows: int
    bytes: int
    sha256: str
    written: bool  # False when an identical file was already there


@dataclass(frozen=True)
class QuarantineRecord:
    """One quarantined row, everything but the row itself."""

    row_number: int | None  # global input row number
    shard: str
    shard_row: int | None  # the row's number within its shard
    op: str
    op_index: int | None
    error_type: str
    error: str

    def describe(self) -> str:
        """``op[1] my_mapper: ValueError: bad value (row 1234)``: the error as one line."""
        op = f"op[{self.op_index}] {self.op}" if self.op_index is not None else self.op
        row = f"row {self.row_number}" if self.row_number is not None else "a row made by an operator"
        first = self.error.strip().splitlines()[0] if self.error.strip() else ""
        return f"{op}: {self.error_type}{': ' + first if first else ''} ({row})"


def encode_line(error: QuarantineRecord, row: bytes) -> bytes:
    """One line of the file: the fields, then ``row`` (a JSON object's bytes, kept as they are)."""
    head = orjson.dumps(error)  # its fields in declaration order: the file's keys, in their order
    return head[:-1] + b',"' + ROW_KEY.encode() + b'":' + row + b"}\n"


def parse_line(line: bytes) -> tuple[QuarantineRecord, Any]:
    """(the error, the row as parsed) of one line; ValueError when it is not one."""
    value = orjson.loads(line)
    if not isinstance(value, dict) or ROW_KEY not in value:
        raise ValueError("not a quarantine record")
    error = QuarantineRecord(
        row_number=value.get("row_number"),
        shard=str(value.get("shard")),
        shard_row=value.get("shard_row"),
        op=str(value.get("op")),
        op_index=value.get("op_index"),
        error_type=str(value.get("error_type")),
        error=str(value.get("error")),
    )
    return error, value[ROW_KEY]


def read_errors(path: Path) -> Iterator[tuple[QuarantineRecord, Any]]:
    with fsio.open_read(path) as handle:
        for line in handle:
            if line.strip():
                yield parse_line(line)


def check_row_errors_file(
    layout: JobLayout,
    entry: ShardEntry,
    result: ShardResult,
    requeue: str,
    sink: Callable[[bytes], None] | None = None,
) -> int:
    """Re-check an accepted result's quarantine file against its record; its rows (0: none)."""
    record = result.errors
    if record is None:
        return 0
    expected = (record.rows, record.bytes, record.sha256)
    check_published_file(
        layout,
        entry,
        result,
        what="quarantine file",
        relative=record.path,
        expected=expected,
        requeue=requeue,
        sink=sink,
    )
    return record.rows
