"""Ray's export parts -> one canonical JSONL file in input order.

What RayExporter (1.6.1) leaves at ``export_path``:

* a directory of parts ``{dataset_uuid}_{write_uuid}_{task_index:06}.json``,
  one per write task (``.json`` even for jsonl); a write task that got no rows
  writes no file, so indices can have gaps;
* an empty directory when every row was filtered out but the schema is known;
* an empty plain *file* when every row was filtered out and Ray lost the schema.

Order: the runner sets Ray Data's ``preserve_order``, under which blocks reach
the write operator in input order, and write tasks are numbered in submission
order; rows inside a part keep block order.  So concatenating parts by task
index is input order.  When the rows carry a row-index field (``order_key``),
parts are instead merged by it (each part is sorted already), which does not
depend on Ray's scheduling at all.

Canonical row: ``json.dumps(row, ensure_ascii=False, separators=(",", ":"),
allow_nan=False)`` with keys in the order Ray wrote them (Data-Juicer's column
order).  Re-serialising also undoes pandas' ``\\/`` escaping.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.errors import ElasticError

# json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False) builds
# this encoder per call; one shared instance writes the same bytes faster.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_PART: Final = re.compile(r"^(?P<dataset>[0-9A-Za-z]+)_(?P<write>[0-9a-f]+)_(?P<task>\d{6,})\.json$")


@dataclass(frozen=True)
class CanonicalOutput:
    path: Path
    rows: int
    bytes: int
    sha256: str


def list_parts(export_path: Path) -> list[Path]:
    """Ray's part files ordered by write-task index; [] when nothing was written."""
    if not export_path.exists():
        raise ElasticError(
            "Data-Juicer finished but wrote nothing at the export path",
            where=str(export_path),
            hint="see process.log in the attempt directory",
        )
    if export_path.is_file():
        if export_path.stat().st_size:
            raise ElasticError(
                "expected a directory of Ray part files or an empty file, found a non-empty file",
                where=str(export_path),
            )
        return []
    parts: list[tuple[int, Path]] = []
    writes: set[tuple[str, str]] = set()
    for entry in sorted(export_path.iterdir()):
        if entry.name.startswith("."):
            continue  # hidden temporaries of a filesystem layer, never parts
        match = _PART.match(entry.name)
        if match is None or not entry.is_file():
            raise ElasticError(
                f"unexpected entry {entry.name!r} among Ray's part files",
                where=str(export_path),
                hint="the export directory must be cleared before each run",
            )
        writes.add((match["dataset"], match["write"]))
        parts.append((int(match["task"]), entry))
    if len(writes) > 1:
        # Two sets of parts means two runs wrote here: their union is not the shard.
        raise ElasticError(
            f"{len(writes)} different Ray writes in one export directory",
            where=str(export_path),
            hint="the export directory must be cleared before each run",
        )
    return [path for _, path in sorted(parts)]


def write_canonical(
    parts: list[Path],
    output_path: Path,
    *,
    order_key: str | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> CanonicalOutput:
    """Write the rows of ``parts`` as canonical JSONL, atomically, and describe the file.

    ``on_row`` sees every written row (the per-shard stats summary), so nothing re-reads the output.
    """
    tmp = output_path.with_name(f".{output_path.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    rows = size = 0
    try:
        with open(tmp, "wb") as out:
            for row in _ordered_rows(parts, order_key):
                line = _ENCODER.encode(row).encode("utf-8") + b"\n"
                out.write(line)
                digest.update(line)
                if on_row is not None:
                    on_row(row)
                rows += 1
                size += len(line)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, output_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return CanonicalOutput(output_path, rows, size, digest.hexdigest())


def _ordered_rows(parts: list[Path], order_key: str | None) -> Iterator[dict[str, Any]]:
    if order_key is None:
        for part in parts:
            yield from _read_part(part)
        return
    # heapq.merge is stable across inputs (earlier part first on ties), so rows
    # an operator split out of one input row stay in part order.
    keyed = (((_order_value(row, order_key, part), row) for row in _read_part(part)) for part in parts)
    for _, row in heapq.merge(*keyed, key=lambda item: item[0]):
        yield row


def _read_part(part: Path) -> Iterator[dict[str, Any]]:
    with open(part, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ElasticError(f"Ray wrote a malformed row: {exc}", where=f"{part}:{number}") from exc
            if not isinstance(row, dict):
                raise ElasticError("Ray wrote a row that is not a JSON object", where=f"{part}:{number}")
            yield row


def _order_value(row: dict[str, Any], key: str, part: Path) -> int:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ElasticError(
            f"row-order field {key!r} is missing or not an integer ({value!r})",
            where=str(part),
            hint="an operator dropped or changed the row-index field; keep it in the recipe's output",
        )
    return value
