"""The row policy for user JSONL: one JSON object per line, judged the same by every parser.

:func:`reference_row` (``json`` with strict hooks) *is* the policy; :class:`FastJudge` accepts only what it can
prove the reference accepts (jiter, then simdjson for what jiter gets wrong).  The table, with each parser's
part: docs/input-format.md, "Row policy".
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any, Final

import jiter
import simdjson

from data_juicer_elastic.errors import RowError

MAX_DEPTH: Final = 512  # below json's stack-bound limit (~950), so it never decides by running out of stack
# A backslash-u escape into the surrogate range; only rows matching it get the (slower) full check.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


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
        # Some messages end in "at" ("Unterminated string starting at"): do not say it twice.
        raise RowError(f"invalid JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}") from None
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
def _probe_jiter_bounds_depth() -> bool:
    """Whether jiter refuses nesting deeper than MAX_DEPTH (arrays and objects), as it did when this was written
    (its recursion limit is ~200); if a release raises it, depth is checked row by row instead."""
    for open_, close in ((b"[", b"]"), (b'{"a":', b"}")):
        try:
            jiter.from_json(b'{"a":' + open_ * MAX_DEPTH + close * MAX_DEPTH + b"}")
        except ValueError:
            continue
        return False
    return True


DEPTH_BOUNDED_BY_JITER: Final = _probe_jiter_bounds_depth()


class FastJudge:
    """Proves rows acceptable at C speed; None means "let the reference decide".

    Holds a simdjson parser, which is not thread-safe: one judge per thread.
    """

    def __init__(self) -> None:
        self._simd = simdjson.Parser()

    def row(self, body: bytes) -> dict[str, Any] | None:
        try:
            obj = strict_loads(body)
        except ValueError:
            return None
        if type(obj) is not dict or not self.finite(body):
            return None
        if not DEPTH_BOUNDED_BY_JITER and body.count(b"{") + body.count(b"[") > MAX_DEPTH and _depth(obj) > MAX_DEPTH:
            return None
        return obj

    def finite(self, body: bytes) -> bool:
        """simdjson accepts ``body`` as an object: in particular no number overflows a double."""
        return is_object(self._simd, body)


# jiter with the policy's options, bound once (a C-level call per row, no Python frame).
strict_loads: Final = functools.partial(
    jiter.from_json, allow_inf_nan=False, catch_duplicate_keys=True, cache_mode="keys"
)
_SimdObject = simdjson.Object


def is_object(parser: simdjson.Parser, body: bytes) -> bool:
    """simdjson (a validating parser that builds nothing) reads ``body`` as one JSON object."""
    try:
        # The proxy is dropped at once: simdjson refuses to reuse a parser while one lives.
        return type(parser.parse(body)) is _SimdObject
    except Exception:  # noqa: BLE001 - any refusal (ValueError, RuntimeError, ...) means "not proven"
        return False


def serialise_row(row: dict[str, Any]) -> bytes:
    try:
        return json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        raise RowError("string holds a lone UTF-16 surrogate, which UTF-8 cannot encode") from None
