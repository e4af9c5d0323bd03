"""An attempt: what it is handed and returns (plain frozen dataclasses of paths and numbers, so a runner,
``execution.ShardRunner``, or a scanner, ``shards.scan``, depends on nothing else in ``jobdir`` and a task
pickles anywhere), its private directory, and its result: ``result.json`` ``link()``ed to
``done/<shard>.json`` (first wins: docs/leases-on-nfs.md, item 4), re-checked by every reader.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
from loguru import logger

from data_juicer_elastic.errors import IntegrityError, JobDirError
from data_juicer_elastic.jobdir.exports import (
    FORGED_HINT,
    check_published_file,
    check_row_errors_file,
    describe_row_errors,
    describe_row_stats,
)
from data_juicer_elastic.jobdir.layout import SCANS, JobLayout, ensure_dir
from data_juicer_elastic.jobdir.records import (
    AttemptExit,
    AttemptRecord,
    Claim,
    ScanRefusal,
    ScanResult,
    ShardEntry,
    ShardResult,
)
from data_juicer_elastic.rows.jsonl import NormaliseOptions, validate_jsonl_output
from data_juicer_elastic.rows.shard_source import ShardSource, SourceSpan
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

MAX_ERROR_CHARS = 2000
OUTPUT_FILE: Final = "output.jsonl"  # a shard attempt's canonical output, in its attempt directory
_SHARD_NAME = re.compile(r"^part-\d{5}-of-\d{5}\.json$")


@dataclass(frozen=True)
class ShardTask:
    shard_id: str
    source: ShardSource  # where the shard's rows are, and what they hash to (rows.shard_source)
    attempt_dir: Path  # private to this attempt: write logs, work files and the output here
    generation: int  # the claim generation (fencing token)
    attempt_id: str
    input_rows: int  # rows of the shard, from the manifest
    input_sha256: str  # sha256 of the shard's content, from the manifest (checked again while it is read)
    # What the runner's read_ahead(source) returned while the previous shard ran (claim-ahead,
    # jobdir.claiming.ClaimAhead), opaque to the loop and read after the file's check; None: read it now.
    read_ahead: Any = field(default=None, compare=False, repr=False)
    # Deduplication (dedup.stages): stage number -> the shard's input row numbers that stage drops, from
    # its published drop list (checked); the runner marks them in the stage's drop column.  Empty: none.
    drops: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    @property
    def output_path(self) -> Path:
        """The conventional place for the canonical output (``attempt_dir/output.jsonl``)."""
        return self.attempt_dir / OUTPUT_FILE


@dataclass(frozen=True)
class ShardOutput:
    output_path: Path  # must be inside the task's attempt_dir
    rows: int
    bytes: int | None = None  # optional: checked against the file when given
    sha256: str | None = None  # optional: checked against the file when given
    stats_path: Path | None = None  # optional: per-shard stats summary inside attempt_dir (data_juicer_elastic.stats)
    row_stats_path: Path | None = None  # each output row's stats/meta, one line per output row (jobdir.exports)
    errors_path: Path | None = None  # the rows operators failed on, with why (jobdir.exports); None: none


@dataclass(frozen=True)
class SignatureTask:
    """Stage ``stage``'s signature phase of one shard (``dedup.stages.signature_recipe``): the operators
    before its deduplicator, earlier stages' drops applied (``drops``: stage -> the shard's input row
    numbers that stage drops), then the deduplicator's own ``compute_hash``."""

    stage: int  # 1-based stage number (dedup.stages.DedupStage.number)
    shard_id: str
    shard_index: int  # the shard's index in the manifest: the high bits of its global row ids
    source: ShardSource
    attempt_dir: Path  # private to this attempt
    attempt_id: str
    generation: int  # the claim generation (fencing token)
    input_rows: int
    drops: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)
    read_ahead: Any = field(default=None, compare=False, repr=False)  # as ShardTask.read_ahead


@dataclass(frozen=True)
class SignatureOutput:
    """What reached the deduplicator in one shard: ``rows`` their input row numbers (uint64, strictly
    increasing), ``keys`` their bucket keys (uint64, shape ``(len(rows), bands, 2)``, ``dedup.keys``),
    the method (``exact``, ``minhash``, ``simhash``) and its parameters (simhash: ``distance``)."""

    rows: np.ndarray
    keys: np.ndarray
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    # Input row numbers whose ``compute_hash`` raised, quarantined in the attempt's ``errors.jsonl`` (like any
    # operator error): the final run does not hash again, so the stage's drop list must name them too.
    failed: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    errors_path: Path | None = None  # the signature attempt's quarantined rows (jobdir.exports); None: none


@dataclass(frozen=True)
class ScanTask:
    """One shard's scan: read its spans once, check every row, observe the row schema, hash the
    content and (``copy_path``) copy it.  The spans' ``rows`` are not known yet (0)."""

    shard_id: str
    spans: tuple[SourceSpan, ...]
    options: NormaliseOptions
    attempt_dir: Path  # private to this attempt
    copy_path: Path | None = None  # copy_shards: write the content here (inside attempt_dir)
    copy_codec: str = "none"


@dataclass(frozen=True)
class ScanOutput:
    """What a scan found (``jobdir.records.ScanResult`` without the claim's fields)."""

    rows: int
    bytes: int
    sha256: str
    span_rows: list[int]
    schema: list[Any]
    normalise: bool
    longest_line: int
    refusal: ScanRefusal | None = None
    copy_path: Path | None = None
    stored_bytes: int | None = None
    stored_sha256: str | None = None


@dataclass
class Attempt:
    layout: JobLayout
    claim: Claim
    dir: Path
    record: AttemptRecord


def open_attempt(layout: JobLayout, claim: Claim, identity: WorkerIdentity) -> Attempt:
    """Create the attempt's private directory and its attempt.json (start)."""
    directory = ensure_dir(layout, layout.attempt_dir(claim.shard_id, claim.attempt_id))
    record = AttemptRecord(
        shard_id=claim.shard_id,
        attempt_id=claim.attempt_id,
        generation=claim.generation,
        node_id=identity.node_id,
        hostname=identity.hostname,
        boot_id=identity.boot_id,
        pid=identity.pid,
        started_at=time.time(),
    )
    fsio.atomic_write(directory / "attempt.json", record.encode())
    return Attempt(layout, claim, directory, record)


def close_attempt(attempt: Attempt | None, exit_reason: AttemptExit, **end: int | str | None) -> None:
    """Rewrite attempt.json with the end (``end``: its ``rows``, ``error``, ``quarantined``); None:
    the attempt was never opened.  Informational only, so a write error is logged."""
    if attempt is None:
        return
    batching = read_batching_summary(attempt.layout, attempt.claim.shard_id, attempt.claim.attempt_id)
    attempt.record = replace(attempt.record, ended_at=time.time(), exit_reason=exit_reason, batching=batching, **end)
    try:
        fsio.atomic_write(attempt.dir / "attempt.json", attempt.record.encode())
    except OSError as exc:
        logger.warning(f"could not record the end of attempt {attempt.claim.attempt_id}: {exc}")


def read_batching_summary(layout: JobLayout, shard_id: str, attempt_id: str) -> dict | None:
    """The attempt's adaptive-batching summary (written by the shard runner), None if absent or unreadable."""
    path: object = attempt_id
    try:  # the attempt id may come from a corrupt claim: an invalid one is "no summary"
        path = layout.attempt_batching_summary(shard_id, attempt_id)
        data = fsio.read_record(path)
        value = json.loads(data) if data is not None else None
    except (OSError, ValueError, JobDirError) as exc:
        logger.warning(f"ignoring adaptive batching summary {path}: {exc}")
        return None
    return value if isinstance(value, dict) else None


def error_text(exc: BaseException) -> str:
    """The last non-empty line of an exception's message (tracebacks end with the cause)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[-1] if lines else type(exc).__name__
    return text[-MAX_ERROR_CHARS:]


@dataclass(frozen=True)
class PublishOutcome:
    accepted: bool  # True: our result is the shard's accepted result
    result: ShardResult  # what we computed for our output
    winner: ShardResult | None  # the accepted result (ours, or another attempt's); None if unreadable


def read_done(
    layout: JobLayout, shard_id: str, data: bytes | None = None
) -> tuple[ShardResult | ScanResult | None, str | None]:
    """(accepted result, None), (None, None) when not done, (None, error) when the marker is corrupt.
    ``data``: the marker's bytes when the caller read them already (status reads many in parallel)."""
    path = layout.done(shard_id)
    try:  # oversized, a directory, or not JSON: all "corrupt", never "done" and never a crash
        if data is None:
            data = fsio.read_record(path)
        if data is None:
            return None, None
        # the layout says which kind of task it is: a shard's run, or its scan (jobdir.manifest)
        result = ScanResult.parse_checked(data, path) if layout.tasks == SCANS else ShardResult.parse(data, path)
    except JobDirError as exc:
        return None, str(exc)
    if result.shard_id != shard_id:
        return None, f"{path}: done marker names shard {result.shard_id}"
    return result, None


def list_done(layout: JobLayout) -> list[str]:
    """Shard ids with a done marker, from ONE listing of ``done/``: a hint (a cached listing may miss
    recent markers), trusted to mean "do not claim"; whoever reports on a shard opens its marker."""
    return marker_ids(layout.done_dir)


def marker_ids(directory: Path) -> list[str]:
    """The shard ids named by ``<shard>.json`` markers in ``directory`` (``done/``, ``failed/``), one listing."""
    return [name[: -len(".json")] for name in fsio.list_names(directory) if _SHARD_NAME.match(name)]


def publish_done(
    layout: JobLayout,
    claim: Claim,
    output_path: str | Path,
    *,
    input_rows: int,
    input_sha256: str,
    declared_rows: int | None = None,
    declared_bytes: int | None = None,
    declared_sha256: str | None = None,
    stats_path: str | Path | None = None,
    row_stats_path: str | Path | None = None,
    errors_path: str | Path | None = None,
) -> PublishOutcome:
    """Validate and fsync our output, write result.json, then link it to done/<shard>.json.
    IntegrityError (a failed attempt) when the output is missing, outside the attempt directory, not
    JSONL, or disagrees with what the runner declared; losing the race is not an error."""
    shard = claim.shard_id
    attempt_dir = layout.attempt_dir(shard, claim.attempt_id)
    output = _inside(attempt_dir, output_path, "output", shard)
    if not fsio.exists(output):
        raise IntegrityError(f"shard output {output} does not exist", where=f"shard {shard}")
    fsio.fsync_file(output)  # the bytes must be durable before any record points at them
    try:
        rows, size, sha = validate_jsonl_output(output, str(output))
    except ValueError as exc:
        raise IntegrityError(f"invalid shard output: {exc}", where=f"shard {shard}") from None
    for name, declared, actual in (
        ("rows", declared_rows, rows),
        ("bytes", declared_bytes, size),
        ("sha256", declared_sha256, sha),
    ):
        if declared is not None and declared != actual:
            raise IntegrityError(
                f"runner reported {name}={declared} but the output has {name}={actual}", where=f"shard {shard}"
            )
    stats_rel, stats_sha = _stats_pointer(layout, attempt_dir, stats_path, shard)
    row_stats = None
    if row_stats_path is not None:
        row_stats = describe_row_stats(layout, _inside(attempt_dir, row_stats_path, "row stats", shard), rows, shard)
    errors = None
    if errors_path is not None:
        errors = describe_row_errors(layout, _inside(attempt_dir, errors_path, "quarantine file", shard), shard)
    result = ShardResult(
        shard_id=shard,
        attempt_id=claim.attempt_id,
        generation=claim.generation,
        node_id=claim.node_id,
        rows=rows,
        bytes=size,
        sha256=sha,
        output=(Path(layout.relative(attempt_dir)) / output.resolve().relative_to(attempt_dir.resolve())).as_posix(),
        input_rows=input_rows,
        input_sha256=input_sha256,
        published_at=time.time(),
        stats=stats_rel,
        stats_sha256=stats_sha,
        row_stats=row_stats,
        errors=errors,
    )
    result_path = attempt_dir / "result.json"
    fsio.atomic_write(result_path, result.encode())
    ensure_dir(layout, layout.done_dir)
    if fsio.publish_exclusive(result_path, layout.done(shard)):
        return PublishOutcome(True, result, result)
    winner, error = read_done(layout, shard)
    if winner is None:
        logger.error(f"{shard}: done marker exists but is unreadable ({error}); our result is not published")
    else:
        logger.info(f"{shard}: attempt {winner.attempt_id} published first; ours ({claim.attempt_id}) is discarded")
    return PublishOutcome(False, result, winner)


def _inside(attempt_dir: Path, value: str | Path, what: str, shard: str) -> Path:
    """A side file the runner names, IntegrityError when it is not inside the attempt directory."""
    path = Path(value)
    if attempt_dir.resolve() not in path.resolve().parents:
        raise IntegrityError(f"{what} {path} is not inside the attempt directory {attempt_dir}", where=f"shard {shard}")
    return path


def _stats_pointer(
    layout: JobLayout, attempt_dir: Path, stats_path: str | Path | None, shard: str
) -> tuple[str | None, str | None]:
    """(path relative to the job, sha256) of the runner's stats summary, made durable first.  It is
    advisory (finalize recomputes a missing one), so one outside the attempt directory is left out."""
    if stats_path is None:
        return None, None
    path = Path(stats_path)
    try:
        path.resolve().relative_to(attempt_dir.resolve())
        fsio.fsync_file(path)
        _, sha = fsio.file_sha256(path)
    except (ValueError, OSError) as exc:
        logger.warning(f"{shard}: stats summary {path} left out of the result: {exc}")
        return None, None
    return layout.relative(path), sha


def validate_result(
    layout: JobLayout,
    entry: ShardEntry,
    result: ShardResult,
    sink: Callable[[bytes], None] | None = None,
    *,
    check_row_stats: bool = True,
) -> Path:
    """Re-check an accepted result against its output file (and its side files, unless
    ``check_row_stats`` is off: merge checks each as it copies it); IntegrityError naming the shard.
    ``sink`` receives the output in blocks of whole, validated lines (merge copies in the same read)."""
    if result.shard_id != entry.shard_id or result.input_sha256 != entry.sha256 or result.input_rows != entry.rows:
        raise IntegrityError(
            f"done marker belongs to different input (input sha256 {result.input_sha256}, expected {entry.sha256})",
            where=f"shard {entry.shard_id}",
            hint=FORGED_HINT,
        )
    requeue = requeue_hint(layout, [entry.shard_id])
    expected = (result.rows, result.bytes, result.sha256)
    output = check_published_file(
        layout, entry, result, what="output", relative=result.output, expected=expected, requeue=requeue, sink=sink
    )
    if check_row_stats:
        check_row_stats_file(layout, entry, result)
        check_row_errors_file(layout, entry, result, requeue)
    return output


def check_row_stats_file(
    layout: JobLayout, entry: ShardEntry, result: ShardResult, sink: Callable[[bytes], None] | None = None
) -> int:
    """Re-check an accepted result's row stats file (one line per output row); its rows (0: none made)."""
    record = result.row_stats
    if record is None:
        return 0
    hint, expected = requeue_hint(layout, [entry.shard_id]), (result.rows, record.bytes, record.sha256)
    check_published_file(
        layout, entry, result, what="row stats file", relative=record.path, expected=expected, requeue=hint, sink=sink
    )
    return result.rows


def requeue_hint(layout: JobLayout, shard_ids: list[str]) -> str:
    """How to run done shards whose result is gone or corrupt again (``jobdir.retry``)."""
    shown = " ".join(shard_ids[:8]) + (" ..." if len(shard_ids) > 8 else "")
    job = shlex.quote(str(layout.root))  # a command to paste: quoted for the shell
    return f"requeue with `dj-elastic retry --job-dir {job} --shard-id {shown}`, then run a worker"
