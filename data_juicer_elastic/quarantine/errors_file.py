"""After a shard's operators ran: fold the Ray workers' records (:mod:`.collector`) into the attempt's
``errors.jsonl`` (:mod:`jobdir.row_files`), in input order with each input row's own bytes, and apply
``elastic.max_error_rows``.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
from loguru import logger

from data_juicer_elastic.errors import ShardExecutionError
from data_juicer_elastic.jobdir.row_files import ERRORS_FILE, WORKER_DIR, QuarantineRecord, encode_line
from data_juicer_elastic.sharedfs import fsio

SETTING: Final = "elastic.max_error_rows"


@dataclass(frozen=True)
class Quarantined:
    """An attempt's quarantined rows: the file (None when there are none), how many, the first."""

    path: Path | None
    rows: int
    first: QuarantineRecord | None


def fold_errors(
    attempt_dir: Path,
    shard_id: str,
    input_lines: Callable[[], Iterable[bytes]],
    first_row: Callable[[], int],
) -> Quarantined:
    """Write ``attempt_dir/errors.jsonl`` from the workers' records (nothing when there are none).

    ``input_lines()``: the shard's rows as stored (without newlines, in order), read to their end
    even past the last row wanted: a source that checks its content once read whole
    (``rows.shard_source.iter_source_lines``: against its scan's sha256) raises there, before the
    file is written, when the rows taken are not the content that was scanned.  ``first_row()``:
    the global number of the shard's first row.  Both are called only when some row failed."""
    records = _read_records(attempt_dir / WORKER_DIR)
    if not records:
        return Quarantined(None, 0, None)
    offset = first_row()
    wanted = sorted({r["n"] for r in records if r["n"] is not None})
    rows = _input_rows(input_lines(), wanted, shard_id) if wanted else {}  # no input row copied: none read
    path = attempt_dir / ERRORS_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    first: QuarantineRecord | None = None
    with open(tmp, "wb") as handle:
        for record in records:
            number = record["n"]
            error = QuarantineRecord(
                row_number=None if number is None else offset + number,
                shard=shard_id,
                shard_row=number,
                op=str(record.get("op")),
                op_index=record.get("op_index"),
                error_type=str(record.get("type")),
                error=str(record.get("message")),
            )
            first = first or error
            row = rows[number] if number is not None else orjson.dumps(record.get("seen"), default=repr)
            handle.write(encode_line(error, row))
    os.replace(tmp, path)
    return Quarantined(path, len(records), first)


def allowed_errors(max_error_rows: float, input_rows: int) -> int:
    """Rows a shard of ``input_rows`` may quarantine: a count (>= 1), or a fraction (< 1) of its rows,
    rounded up, so that a fraction lets every non-empty shard set at least one row aside."""
    return int(max_error_rows) if max_error_rows >= 1 else math.ceil(max_error_rows * input_rows)


def check_limit(found: Quarantined, max_error_rows: float, input_rows: int, where: str) -> None:
    """ShardExecutionError (the shard fails like any error) when more rows failed than allowed."""
    allowed = allowed_errors(max_error_rows, input_rows)
    if found.rows <= allowed:
        return
    raise ShardExecutionError(
        f"operators failed on {found.rows} of {input_rows} rows, more than {SETTING}={max_error_rows:g} allows "
        f"({allowed}); the first: {found.first.describe() if found.first else 'unknown'}",
        where=where,
        hint=f"fix the operator or those rows (each with its error: {found.path}), or raise {SETTING}",
    )


def _read_records(directory: Path) -> list[dict[str, Any]]:
    """The workers' records, deduplicated, in input order (rows an operator made last).  A row recorded twice
    (Ray re-ran a task after its worker died) is one: same number, operator stage and row the operator saw."""
    seen: dict[tuple, dict[str, Any]] = {}
    for name in sorted(fsio.list_names(directory)):
        if not name.endswith(".jsonl"):
            continue
        with open(directory / name, "rb") as handle:
            for line in handle:
                if not line.endswith(b"\n"):
                    logger.warning(f"ignoring a torn quarantine record in {directory / name}")
                    continue
                record = orjson.loads(line)
                seen_row = orjson.dumps(record.get("seen"), option=orjson.OPT_SORT_KEYS, default=repr)
                key = (record.get("n"), str(record.get("stage")), hashlib.sha256(seen_row).hexdigest())
                seen.setdefault(key, record)
    # rows without a number (an operator made them) after every numbered row
    return [seen[key] for key in sorted(seen, key=lambda k: (k[0] is None, k[0] or 0, k[1:]))]


def _input_rows(lines: Iterable[bytes], wanted: list[int], shard_id: str) -> dict[int, bytes]:
    targets = set(wanted)
    # every line, not only up to the last row wanted: the source compares its content with the scan
    # only at its end, and a row copied into the errors file is published as the input's
    found = {number: bytes(line) for number, line in enumerate(lines) if number in targets}
    if len(found) != len(wanted):
        raise ShardExecutionError(
            f"a quarantine record names input row {wanted[len(found)]}, which the shard does not have",
            where=f"shard {shard_id}",
            hint="an operator changed the internal row number column; report it",
        )
    return found
