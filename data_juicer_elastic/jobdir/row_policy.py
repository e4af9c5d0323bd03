"""The row policy for user JSONL: one JSON object per line, judged the same by two parsers.

:func:`reference_row` (the standard library's ``json`` with strict hooks) *is* the policy
(the table in ``docs/input-format.md``).  :func:`fast_row` and :func:`block_proven` are the
orjson accelerator: they accept only what they can prove the reference accepts, and leave
everything else to it.  What orjson alone would get wrong, and how it is closed:

* duplicate keys (orjson keeps the last): every key owns exactly one colon outside
  strings, and orjson never escapes ``:``, so when the raw text holds no ``\\u003a``
  escape, ``raw.count(":") == orjson.dumps(rows).count(":")`` holds iff no key was
  dropped.  A line with as many colons as top-level keys needs no dump at all.
* nesting: orjson reads depths ``json`` cannot; both are held to :data:`MAX_DEPTH`.
* integers beyond 64 bits: orjson turns them into floats (or refuses them), so rows
  that must be re-serialised are re-parsed by the reference, which keeps them exact.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

import orjson

try:
    import numpy as _np
except ImportError:  # pragma: no cover - numpy comes with Data-Juicer; counting falls back to bytes.count
    _np = None

MAX_DEPTH: Final = 512  # below both parsers' own limits, so neither decides it by running out of stack
# A backslash-u escape into the surrogate range; only rows matching it get the (slower) full check.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


class RowError(ValueError):
    pass


# -- the reference parser (the policy) --------------------------------------------------------
def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RowError(f"duplicate key {key!r} in one object")
            seen.add(key)
    return obj


def _parse_constant(name: str) -> Any:
    raise RowError(f"{name} is not valid JSON")


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise RowError(f"number {text[:40]} overflows a double")
    return value


def parse_row(text: str) -> dict[str, Any]:
    """One JSON object under the strict policy; RowError/ValueError otherwise."""
    try:
        obj = json.loads(text, object_pairs_hook=_pairs_hook, parse_constant=_parse_constant, parse_float=_parse_float)
    except RecursionError:
        raise RowError("JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise RowError(f"each line must be a JSON object, got {type(obj).__name__}")
    if _depth(obj) > MAX_DEPTH:
        raise RowError(f"JSON nested too deeply (more than {MAX_DEPTH} levels)")
    return obj


def reference_row(body: bytes) -> dict[str, Any]:
    """The policy's verdict on one stripped line: the row (exact integers) or a RowError/ValueError."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RowError(f"invalid UTF-8 at byte {exc.start} of the line") from None
    try:
        row = parse_row(text)
    except json.JSONDecodeError as exc:
        # The parser's own "line 1" would be confusing next to file:line; give the column.
        raise RowError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    except RowError:
        raise
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise RowError(f"invalid JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(body):
        serialise_row(row)  # raises on a lone surrogate
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


def block_proven(region: tuple[bytes, int, int], parsed: list[dict[str, Any]], singles: int) -> bool:
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


def serialise_row(row: dict[str, Any]) -> bytes:
    try:
        return json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        raise RowError("string holds a lone UTF-16 surrogate, which UTF-8 cannot encode") from None
