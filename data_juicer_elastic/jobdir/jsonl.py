"""Reading user JSONL row by row: validation policy and row normalisation.

Policy for every malformed-input class (errors are InputError with ``where=file:line``):

* Each non-empty line must be one JSON **object** in UTF-8.  Arrays, scalars,
  malformed JSON, invalid UTF-8 and raw control bytes (NUL...) are rejected.
* Blank or whitespace-only lines are rejected: they are usually a sign of a
  concatenation or export bug, and Data-Juicer's readers disagree about them.
* Line endings: LF and CRLF are both accepted; shards are always written with LF.
* A UTF-8 BOM is accepted (and dropped) at the very start of a file only, where
  Windows editors put it; anywhere else it is invalid JSON.
* A missing final newline is accepted: the last line is a row.
* NaN, Infinity and numbers that overflow a double are rejected: they are not
  JSON, and writers downstream would emit invalid JSON or lose the value.
* Duplicate keys in one object are rejected: readers disagree on which wins.
* Lone UTF-16 surrogate escapes (``"\\ud800"``) are rejected: they cannot be
  encoded as UTF-8 by any writer downstream.
* Nesting deeper than Python's JSON recursion limit is rejected.
* Lines longer than ``max_line_bytes`` are rejected, which bounds memory.

Normalisation: media paths (the values under ``media_keys``, each a list of
strings or null) that are relative become absolute against ``base_dir``; absolute
paths and URLs (``scheme://...``) are kept.  A missing ``index_key`` is filled with
the global 0-based row index.  A row that needs no change keeps its original
bytes (minus line ending and surrounding whitespace), so numbers and escapes are
preserved exactly; a changed row is re-serialised compactly with
``ensure_ascii=False`` and its keys in their original order.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.errors import InputError
from data_juicer_elastic.jobdir import fsio

MAX_LINE_BYTES: Final = 64 * 1024 * 1024
_BOM: Final = b"\xef\xbb\xbf"
_URL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
# A backslash-u escape into the surrogate range; only rows matching it get the (slower) full check.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


class _RowError(ValueError):
    pass


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RowError(f"duplicate key {key!r} in one object")
            seen.add(key)
    return obj


def _parse_constant(name: str) -> Any:
    raise _RowError(f"{name} is not valid JSON")


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _RowError(f"number {text[:40]} overflows a double")
    return value


def parse_row(text: str) -> dict[str, Any]:
    """One JSON object with the strict policy above; _RowError/ValueError otherwise."""
    try:
        obj = json.loads(text, object_pairs_hook=_pairs_hook, parse_constant=_parse_constant, parse_float=_parse_float)
    except RecursionError:
        raise _RowError("JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise _RowError(f"each line must be a JSON object, got {type(obj).__name__}")
    return obj


def is_url(value: str) -> bool:
    return bool(_URL.match(value))


@dataclass
class NormaliseOptions:
    base_dir: str  # absolute directory relative media paths are resolved against
    media_keys: Mapping[str, str]  # e.g. {"image_key": "images"}: row keys holding media path lists
    index_key: str | None
    max_line_bytes: int = MAX_LINE_BYTES


@dataclass
class FileScan:
    """What streaming one input file produced (rows, raw sha256, normalised bytes)."""

    rows: int = 0
    sha256: str = ""
    size: int = 0
    normalised_bytes: int = 0


def iter_normalised(
    path: Path, display: str, options: NormaliseOptions, first_index: int, scan: FileScan
) -> Iterator[bytes]:
    """Yield each row of ``path`` normalised, newline-terminated; fill ``scan`` as we go.

    ``display`` is the name used in ``file:line`` error locations.  The raw bytes
    are hashed as read, so the fingerprint describes exactly the bytes used.
    """
    digest = hashlib.sha256()
    media_fields = [k for k in dict.fromkeys(options.media_keys.values()) if k]
    limit = options.max_line_bytes
    with fsio.open_read(path) as handle:
        lineno = 0
        while True:
            raw = handle.readline(limit + 1)
            if not raw:
                break
            lineno += 1
            where = f"{display}:{lineno}"
            digest.update(raw)
            scan.size += len(raw)
            if len(raw) > limit and not raw.endswith(b"\n"):
                raise InputError(
                    f"line longer than {limit} bytes",
                    where=where,
                    hint="split huge rows or raise the line limit",
                )
            body = raw[:-1] if raw.endswith(b"\n") else raw
            if body.endswith(b"\r"):
                body = body[:-1]
            if lineno == 1 and body.startswith(_BOM):
                body = body[len(_BOM) :]
            body = body.strip(b" \t")
            if not body.strip(b" \t\r\n"):
                raise InputError(
                    "blank line", where=where, hint="remove empty lines; every line must be one JSON object"
                )
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"invalid UTF-8 at byte {exc.start} of the line", where=where, hint="re-encode the file as UTF-8"
                ) from None
            try:
                row = parse_row(text)
                changed = _normalise(row, media_fields, options, first_index + scan.rows)
                out = _serialise(row) if changed else body
                if not changed and _SURROGATE_ESCAPE.search(body):
                    _serialise(row)  # raises on a lone surrogate
            except _RowError as exc:
                raise InputError(str(exc), where=where) from None
            except json.JSONDecodeError as exc:
                # The parser's own "line 1" would be confusing next to file:line; give the column.
                raise InputError(f"invalid JSON: {exc.msg} at column {exc.colno}", where=where) from None
            except ValueError as exc:
                raise InputError(f"invalid JSON: {exc}", where=where) from None
            scan.rows += 1
            scan.normalised_bytes += len(out) + 1
            yield out + b"\n"
    scan.sha256 = digest.hexdigest()


def _serialise(row: dict[str, Any]) -> bytes:
    try:
        return json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        raise _RowError("string holds a lone UTF-16 surrogate, which UTF-8 cannot encode") from None


def _normalise(row: dict[str, Any], media_fields: list[str], options: NormaliseOptions, index: int) -> bool:
    changed = False
    for key in media_fields:
        if key not in row:
            continue
        value = row[key]
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _RowError(f"{key!r} must be a list of strings or null, got {_describe(value)}")
        fixed = [_absolute(v, options.base_dir) for v in value]
        if fixed != value:
            row[key] = fixed
            changed = True
    if options.index_key and options.index_key not in row:
        row[options.index_key] = index
        changed = True
    return changed


def _absolute(value: str, base_dir: str) -> str:
    # Empty strings are left alone: there is no sensible absolute form, and the
    # operator that reads them reports the problem with its own context.
    if not value or is_url(value) or os.path.isabs(value):
        return value
    # Plain join, no normpath: collapsing ".." through a symlinked directory would
    # change which file is meant.
    return os.path.join(base_dir, value)


def _describe(value: Any) -> str:
    if isinstance(value, list):
        bad = next(v for v in value if not isinstance(v, str))
        return f"a list holding {type(bad).__name__} {json.dumps(bad)[:40]}"
    return f"{type(value).__name__} {json.dumps(value)[:40]}"


def validate_jsonl_output(
    path: Path, display: str, sink: Callable[[bytes], None] | None = None
) -> tuple[int, int, str]:
    """(rows, bytes, sha256) of a shard *output*, checking every line is a JSON object.

    Output parsing is lenient where input parsing is strict (NaN, duplicate keys):
    it exists to catch torn or truncated files, not to re-judge what the recipe wrote.
    Raises ValueError with ``file:line`` on a bad line or missing final newline.
    ``sink`` receives every line (merge copies while it validates: one read per shard).
    """
    digest = hashlib.sha256()
    rows = size = 0
    with fsio.open_read(path) as handle:
        for lineno, line in enumerate(handle, start=1):
            digest.update(line)
            size += len(line)
            if not line.endswith(b"\n"):
                raise ValueError(f"{display}:{lineno}: last line has no newline (truncated?)")
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"{display}:{lineno}: not valid JSON ({exc})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{display}:{lineno}: not a JSON object")
            rows += 1
            if sink is not None:
                sink(line)
    return rows, size, digest.hexdigest()
