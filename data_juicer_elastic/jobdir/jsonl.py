"""Reading user JSONL: the validation policy, row normalisation, and shard-output validation.

The policy for every malformed-input class is the table in ``docs/input-format.md``;
errors are InputError with ``where=file:line``.  In short: every non-empty line is
one JSON object in UTF-8; LF and CRLF line endings, a BOM at the very start of a
file, spaces/tabs around a row and a missing final newline are accepted; blank
lines, arrays/scalars, invalid UTF-8, raw control bytes (NUL...), NaN/Infinity,
numbers that overflow a double, duplicate keys, lone UTF-16 surrogates, nesting
deeper than :data:`MAX_DEPTH` and lines longer than ``max_line_bytes`` are refused.

Two parsers, one policy.  :func:`reference_row` (the standard library's ``json``
with strict hooks) *is* the policy.  :func:`fast_row` (orjson) is an accelerator:
it returns a row only when it can prove the reference would accept the line, and
``None`` otherwise, after which the reference decides and words the error.  What
orjson alone would get wrong, and how it is closed:

* duplicate keys (orjson keeps the last): every key owns exactly one colon outside
  strings, and orjson never escapes ``:``, so when the raw line holds no ``\\u003a``
  escape, ``raw.count(":") == orjson.dumps(row).count(":")`` holds iff no key was
  dropped.  A line with as many colons as top-level keys needs no dump at all.
* nesting: orjson accepts depths ``json`` cannot; both are held to ``MAX_DEPTH``.
* integers beyond 64 bits: orjson turns them into floats (or rejects them), so rows
  that must be re-serialised are re-parsed by the reference, which keeps them exact.

Normalisation: media paths (values under ``media_keys``, each a list of strings or
null) that are relative become absolute against ``base_dir``; absolute paths and
URLs are kept.  A missing ``index_key`` is appended as the last key with the global
0-based row index, leaving the row's other bytes as written.  A row that needs no
change keeps its original bytes (minus line ending and surrounding spaces/tabs); a
row whose media paths change is re-serialised compactly (``ensure_ascii=False``,
keys in their original order).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

try:
    import numpy as _np
except ImportError:  # pragma: no cover - numpy comes with Data-Juicer; counting falls back to bytes.count
    _np = None

from data_juicer_elastic.errors import InputError
from data_juicer_elastic.jobdir import fsio
from data_juicer_elastic.jobdir.codecs import prefetch

MAX_LINE_BYTES: Final = 64 * 1024 * 1024
MAX_DEPTH: Final = 512  # below both parsers' own limits, so neither decides it by running out of stack
BLOCK_BYTES: Final = 8 * 1024 * 1024
_BOM: Final = b"\xef\xbb\xbf"
_URL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
# A backslash-u escape into the surrogate range; only rows matching it get the (slower) full check.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")
_OPEN: Final = 123  # "{"
_CLOSE: Final = 125  # "}"


class _RowError(ValueError):
    pass


# -- the reference parser (the policy) --------------------------------------------------------
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
    """One JSON object under the strict policy; _RowError/ValueError otherwise."""
    try:
        obj = json.loads(text, object_pairs_hook=_pairs_hook, parse_constant=_parse_constant, parse_float=_parse_float)
    except RecursionError:
        raise _RowError("JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise _RowError(f"each line must be a JSON object, got {type(obj).__name__}")
    if _depth(obj) > MAX_DEPTH:
        raise _RowError(f"JSON nested too deeply (more than {MAX_DEPTH} levels)")
    return obj


def reference_row(body: bytes) -> dict[str, Any]:
    """The policy's verdict on one stripped line: the row (exact integers) or a _RowError/ValueError."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _RowError(f"invalid UTF-8 at byte {exc.start} of the line") from None
    try:
        row = parse_row(text)
    except json.JSONDecodeError as exc:
        # The parser's own "line 1" would be confusing next to file:line; give the column.
        raise _RowError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    except _RowError:
        raise
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise _RowError(f"invalid JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(body):
        _serialise(row)  # raises on a lone surrogate
    return row


def _depth(value: Any) -> int:
    """Nesting depth of containers (an object holding scalars is 1), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in item if isinstance(child, (dict, list)))
    return deepest


# -- the accelerator --------------------------------------------------------------------------
def fast_row(body: bytes) -> dict[str, Any] | None:
    """The row when orjson proves the reference accepts ``body``; None when the reference must decide."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    colons = body.count(b":")
    if colons != len(obj) and not _no_duplicate_keys(body, obj, colons):
        return None
    if body.count(b"{") + body.count(b"[") > MAX_DEPTH and _depth(obj) > MAX_DEPTH:
        return None
    return obj


def _block_proven(region: tuple[bytes, int, int], parsed: list[dict[str, Any]], singles: int) -> bool:
    """No row of ``parsed`` has a duplicate key or nests deeper than MAX_DEPTH.

    Keys: summed over the block, raw colons minus those of rows judged alone must equal
    the colons orjson writes for the parsed rows (each row can only lose keys, so equal
    sums mean no row lost one).  Depth: orjson refuses to write nesting deeper than
    its limit, which :data:`_DUMPS_BOUNDS_DEPTH` checked is below MAX_DEPTH.
    """
    raw, start, stop = region
    # A colon written as an escape breaks the count; memchr for a backslash first (fast), since
    # most blocks hold none, then the exact search.
    if not _DUMPS_BOUNDS_DEPTH or (raw.find(b"\\", start, stop) >= 0 and raw.find(b"\\u003", start, stop) >= 0):
        return False
    try:
        written = orjson.dumps(parsed)
    except orjson.JSONEncodeError:
        return False
    return count_byte(written, _COLON) == count_byte(raw, _COLON, start, stop) - singles


_COLON: Final = ord(":")
_COUNT_STEP: Final = 256 * 1024  # cache-sized slices: numpy's compare + count stays in L2


def count_byte(data: bytes, value: int, start: int = 0, stop: int | None = None) -> int:
    """How often byte ``value`` occurs in ``data[start:stop]``: ~4x ``bytes.count``'s speed
    (which is a plain byte loop) via numpy's vectorised compare, in cache-sized slices."""
    stop = len(data) if stop is None else stop
    if _np is None or stop - start < _COUNT_STEP:
        return data.count(bytes((value,)), start, stop)
    view = _np.frombuffer(data, dtype=_np.uint8)
    return sum(
        int(_np.count_nonzero(view[i : min(i + _COUNT_STEP, stop)] == value)) for i in range(start, stop, _COUNT_STEP)
    )


def _probe_dumps_depth() -> bool:
    nested: Any = {}
    for _ in range(MAX_DEPTH):
        nested = [nested]
    try:
        orjson.dumps(nested)
    except orjson.JSONEncodeError:
        return True
    return False


_DUMPS_BOUNDS_DEPTH: Final = _probe_dumps_depth()


def _no_duplicate_keys(body: bytes, obj: dict[str, Any], colons: int) -> bool:
    if b"\\u003" in body:  # a colon written as an escape: the count argument no longer holds
        return False
    try:
        return orjson.dumps(obj).count(b":") == colons
    except orjson.JSONEncodeError:  # orjson refuses to write deep nesting: let the reference judge
        return False


def is_url(value: str) -> bool:
    return bool(_URL.match(value))


@dataclass
class NormaliseOptions:
    base_dir: str  # absolute directory relative media paths are resolved against
    media_keys: Mapping[str, str]  # e.g. {"image_key": "images"}: row keys holding media path lists
    index_key: str | None
    max_line_bytes: int = MAX_LINE_BYTES


class RowNormaliser:
    """Validates and normalises the rows of one input file, a list of lines at a time.

    ``lineno`` and ``rows`` count what has been accepted; ``first_index`` is the
    global index of the file's first row (for ``index_key``).
    """

    def __init__(self, display: str, options: NormaliseOptions, first_index: int):
        self.display = display
        self.options = options
        self.media_fields = [k for k in dict.fromkeys(options.media_keys.values()) if k]
        self.index_key = options.index_key
        self._index_suffix = orjson.dumps(options.index_key) + b":" if options.index_key else b""
        self.first_index = first_index
        self.rows = 0

    def lines(self, lines: list[bytes], region: tuple[bytes, int, int] | None = None) -> list[bytes] | None:
        """Validate ``lines`` (no line endings); None when every one is kept byte for byte,
        else the normalised lines.  InputError naming file:line on the first bad one.

        ``region`` is ``(raw, start, stop)`` when ``raw[start:stop]`` is exactly these lines
        with their newlines: duplicate keys and depth are then proven for the whole block
        with two C-level scans instead of per-row work (see the module docstring).
        """
        if region is not None:
            parsed = self._parse_clean(lines)
            if parsed is not None:  # every line a bare object needing no change: one block proof
                if not _block_proven(region, parsed, 0):
                    self._prove_each(lines, range(len(lines)))
                self.rows += len(lines)
                return None
        return self._lines_one_by_one(lines, region)

    def _parse_clean(self, lines: list[bytes]) -> list[dict[str, Any]] | None:
        """The hot loop: every line a bare ``{...}`` that orjson parses to an object whose media
        paths (if any) are already absolute and which has its index key; else None (the block
        then goes row by row, which also words any error)."""
        loads, decode_error, parsed = orjson.loads, orjson.JSONDecodeError, []
        append, media, index_key, base = parsed.append, self.media_fields, self.index_key, self.options.base_dir
        try:
            for line in lines:
                if line[:1] != b"{" or line[-1:] != b"}":
                    return None
                obj = loads(line)
                if type(obj) is not dict:
                    return None
                for key in media:
                    if obj.get(key) is not None and _media_changes(obj, [key], base):
                        return None
                if index_key is not None and index_key not in obj:
                    return None
                append(obj)
        except (decode_error, _RowError):
            return None
        return parsed

    def _lines_one_by_one(self, lines: list[bytes], region: tuple[bytes, int, int] | None) -> list[bytes] | None:
        out: list[bytes] | None = None
        needs_rows = bool(self.media_fields or self.index_key)
        loads, decode_error = orjson.loads, orjson.JSONDecodeError
        parsed: list[dict[str, Any]] = []
        unproven: list[int] = []  # indexes of rows parsed by orjson whose keys/depth still need proof
        singles = 0  # raw colons of rows judged one by one (outside the block proof)
        for i, line in enumerate(lines):
            obj = None
            if line[-1:] == b"}" and line[:1] == b"{":
                try:
                    obj = loads(line)
                except decode_error:
                    pass
                if type(obj) is not dict:
                    obj = None
            if obj is None:
                try:
                    new = self._row(line, None, self.rows + i)  # judged alone, fully
                except InputError:
                    self._prove_each(lines, unproven)  # an earlier bad row is the one to report
                    raise
                if region is not None:
                    singles += line.count(b":")
            else:
                parsed.append(obj)
                unproven.append(i)
                new = self._normalise(line, obj, self.rows + i) if needs_rows else line
            if new is not line and out is None:
                out = lines[:i]
            if out is not None:
                out.append(new)
        if unproven and not (region is not None and _block_proven(region, parsed, singles)):
            self._prove_each(lines, unproven)
        self.rows += len(lines)
        return out

    def _prove_each(self, lines: list[bytes], indexes: Iterable[int]) -> None:
        for i in indexes:
            if fast_row(lines[i]) is None:  # the reference words the error (or accepts: an escaped-colon key)
                self._row(lines[i], None, self.rows + i)

    def _row(self, line: bytes, obj: dict[str, Any] | None, row_in_file: int) -> bytes:
        """The slow path of one line: strip, judge by the reference if needed, normalise."""
        body = line
        if obj is None:
            body = _strip(line, first=row_in_file == 0)
            where = f"{self.display}:{row_in_file + 1}"
            if not body:
                raise InputError(
                    "blank line", where=where, hint="remove empty lines; every line must be one JSON object"
                )
            obj = fast_row(body)
            if obj is None:
                try:
                    obj = reference_row(body)
                except (_RowError, ValueError) as exc:
                    raise InputError(str(exc), where=where) from None
        return self._normalise(body, obj, row_in_file)

    def _normalise(self, body: bytes, obj: dict[str, Any], row_in_file: int) -> bytes:
        index = self.first_index + row_in_file
        try:
            if self.media_fields and _media_changes(obj, self.media_fields, self.options.base_dir):
                row = reference_row(body)  # exact integers, original key order
                _media_changes(row, self.media_fields, self.options.base_dir, apply=True)
                if self.index_key and self.index_key not in row:
                    row[self.index_key] = index
                return _serialise(row)
        except _RowError as exc:
            raise InputError(str(exc), where=f"{self.display}:{row_in_file + 1}") from None
        if self.index_key and self.index_key not in obj:
            # Appended as the last key, like a dict insert; the rest of the row keeps its bytes.
            return body[:-1] + (b"," if obj else b"") + self._index_suffix + str(index).encode() + b"}"
        return body


def _strip(line: bytes, first: bool) -> bytes:
    body = line[:-1] if line.endswith(b"\r") else line
    if first and body.startswith(_BOM):
        body = body[len(_BOM) :]
    return body.strip(b" \t")


def _serialise(row: dict[str, Any]) -> bytes:
    try:
        return json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        raise _RowError("string holds a lone UTF-16 surrogate, which UTF-8 cannot encode") from None


def _media_changes(row: dict[str, Any], media_fields: list[str], base_dir: str, apply: bool = False) -> bool:
    changed = False
    for key in media_fields:
        value = row.get(key)
        if value is None:
            continue
        if type(value) is not list or not all(type(v) is str for v in value):
            raise _RowError(f"{key!r} must be a list of strings or null, got {_describe(value)}")
        fixed = [_absolute(v, base_dir) for v in value]
        if fixed != value:
            changed = True
            if apply:
                row[key] = fixed
    return changed


def _absolute(value: str, base_dir: str) -> str:
    # Empty strings are left alone: there is no sensible absolute form, and the
    # operator that reads them reports the problem with its own context.
    if not value or os.path.isabs(value) or is_url(value):
        return value
    # Plain join, no normpath: collapsing ".." through a symlinked directory would
    # change which file is meant.
    return os.path.join(base_dir, value)


def _describe(value: Any) -> str:
    if isinstance(value, list):
        bad = next(v for v in value if not isinstance(v, str))
        return f"a list holding {type(bad).__name__} {json.dumps(bad)[:40]}"
    return f"{type(value).__name__} {json.dumps(value)[:40]}"


# -- shard outputs ----------------------------------------------------------------------------
def validate_jsonl_output(
    path: Path, display: str, sink: Callable[[bytes], None] | None = None
) -> tuple[int, int, str]:
    """(rows, bytes, sha256) of a shard *output*, checking every line is a JSON object.

    Output parsing is lenient where input parsing is strict (NaN, duplicate keys):
    it exists to catch torn or truncated files, not to re-judge what the recipe wrote.
    Raises ValueError with ``file:line`` on a bad line or missing final newline.
    ``sink`` receives the file's bytes in order, in blocks of whole lines, each
    after its lines were checked (merge copies while it validates: one read per shard).
    """
    digest = hashlib.sha256()
    rows = size = 0
    carry = b""
    loads, decode_error = orjson.loads, orjson.JSONDecodeError

    def hashed_chunks() -> Iterator[bytes]:  # runs on the reader thread: read + sha256 overlap parsing
        with fsio.open_read(path) as handle:
            while chunk := handle.read(BLOCK_BYTES):
                digest.update(chunk)
                yield chunk

    chunks = prefetch(hashed_chunks)
    try:
        for chunk in chunks:
            size += len(chunk)
            block = carry + chunk if carry else chunk
            cut = block.rfind(b"\n") + 1  # whole lines end here; the rest waits for the next chunk
            if not cut:
                carry = block
                continue
            whole = block[:cut] if cut < len(block) else block
            carry = block[cut:]
            lines = whole.split(b"\n")
            lines.pop()  # the empty piece after the last newline
            for i, line in enumerate(lines):
                try:
                    obj = loads(line)
                except decode_error:
                    obj = _lenient(line, f"{display}:{rows + i + 1}")
                if type(obj) is not dict:
                    raise ValueError(f"{display}:{rows + i + 1}: not a JSON object")
            rows += len(lines)
            if sink is not None:
                sink(whole)
    finally:
        chunks.close()
    if carry:
        raise ValueError(f"{display}:{rows + 1}: last line has no newline (truncated?)")
    return rows, size, digest.hexdigest()


def _lenient(line: bytes, where: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
