"""Reading user JSONL: row normalisation in blocks (errors are InputError with ``where=file:line``), and
shard-output validation.  The row policy is :mod:`row_policy`; what normalisation does:
docs/input-format.md, "Row policy".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
import simdjson

from data_juicer_elastic.errors import InputError, RowError
from data_juicer_elastic.rows.codecs import READ_BYTES, prefetch
from data_juicer_elastic.rows.line_framer import LineFramer
from data_juicer_elastic.rows.row_policy import (
    DEPTH_BOUNDED_BY_JITER,
    FastJudge,
    is_object,
    reference_row,
    serialise_row,
    strict_loads,
)
from data_juicer_elastic.rows.row_schema import RowSchema
from data_juicer_elastic.settings import DEFAULT_MAX_LINE_BYTES
from data_juicer_elastic.sharedfs import fsio

# Data-Juicer's recipe keys naming the row fields that hold media paths, with its defaults.
DEFAULT_MEDIA_KEYS: Final = {"image_key": "images", "audio_key": "audios", "video_key": "videos"}
_BOM: Final = b"\xef\xbb\xbf"
_URL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


@dataclass
class NormaliseOptions:
    base_dir: str  # absolute directory relative media paths are resolved against
    media_keys: Mapping[str, str]  # e.g. {"image_key": "images"}: row keys holding media path lists
    index_key: str | None
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES


class RowNormaliser:
    """Validates and normalises the rows of one input file, a list of lines at a time.

    ``rows`` counts what has been accepted; ``first_index`` is the global index of the first row (for
    ``index_key``); ``file_start``: the lines start at the beginning of their file (False for a span that starts
    mid-file: error line numbers count from the span's first line, and a BOM on it is not the file's).  Every
    accepted row's JSON types are joined into ``schema``.
    """

    def __init__(
        self,
        display: str,
        options: NormaliseOptions,
        first_index: int,
        schema: RowSchema | None = None,
        file_start: bool = True,
    ):
        self.display = display
        self.file_start = file_start
        self.options = options
        self.media_fields = [k for k in dict.fromkeys(options.media_keys.values()) if k]
        self.index_key = options.index_key
        self._index_suffix = orjson.dumps(options.index_key) + b":" if options.index_key else b""
        self.first_index = first_index
        self.rows = 0
        self.schema = RowSchema() if schema is None else schema
        self._judge = FastJudge()

    def lines(self, lines: list[bytes]) -> list[bytes] | None:
        """Validate ``lines`` (no line endings); None when every one is kept byte for byte, else the normalised
        lines.  InputError naming file:line on the first bad one."""
        if self.is_clean(lines):
            self.rows += len(lines)
            return None
        return self._lines_one_by_one(lines)

    def is_clean(self, lines: list[bytes], schema: RowSchema | None = None) -> bool:
        """The hot loop: every line a bare ``{...}`` the accelerator proves, whose media paths (if any) are
        already absolute and which has its index key.  False sends the block row by row, which also words any
        error.  (Row at a time on purpose: parsing the block into a list first, or one simdjson call over the
        joined block, measured slower: the rows' objects then outlive the CPU cache.)  The rows' types are joined
        into ``schema`` (default: this normaliser's); a block found unclean half-way is observed again row by row,
        which changes nothing (a join is idempotent and keeps first-seen key order)."""
        loads, finite, media, index_key = strict_loads, self._judge.finite, self.media_fields, self.index_key
        observe = (schema or self.schema).observe
        base = self.options.base_dir
        try:
            for line in lines:
                if line[:1] != b"{" or line[-1:] != b"}":
                    return False
                obj = loads(line)
                if not finite(line):
                    return False
                observe(obj)
                for key in media:
                    if obj.get(key) is not None and _media_changes(obj, [key], base):
                        return False
                if index_key is not None and index_key not in obj:
                    return False
        except (ValueError, RowError):
            return False
        return DEPTH_BOUNDED_BY_JITER or all(self._judge.row(line) is not None for line in lines)

    def _lines_one_by_one(self, lines: list[bytes]) -> list[bytes] | None:
        out: list[bytes] | None = None
        needs_rows = bool(self.media_fields or self.index_key)
        judge = self._judge.row
        for i, line in enumerate(lines):
            obj = judge(line) if line[-1:] == b"}" and line[:1] == b"{" else None
            if obj is None:
                new = self._row(line, self.rows + i)  # judged alone, fully
            elif needs_rows:
                new = self._normalise(line, obj, self.rows + i)
            else:
                self.schema.observe(obj)
                new = line
            if new is not line and out is None:
                out = lines[:i]
            if out is not None:
                out.append(new)
        self.rows += len(lines)
        return out

    def _row(self, line: bytes, row_in_file: int) -> bytes:
        """The slow path of one line: strip, judge (by the reference if need be), normalise."""
        body = _strip(line, first=self.file_start and row_in_file == 0)
        where = f"{self.display}:{row_in_file + 1}"
        if not body:
            raise InputError("blank line", where=where, hint="remove empty lines; every line must be one JSON object")
        obj = self._judge.row(body)
        if obj is None:
            try:
                obj = reference_row(body)
            except (RowError, ValueError) as exc:
                raise InputError(str(exc), where=where) from None
        return self._normalise(body, obj, row_in_file)

    def _normalise(self, body: bytes, obj: dict[str, Any], row_in_file: int) -> bytes:
        """The row as it goes into its shard (its types joined into the schema)."""
        index = self.first_index + row_in_file
        self.schema.observe(obj)  # media paths change only strings; the index key is observed below
        if self.index_key and self.index_key not in obj:
            self.schema.observe({self.index_key: index})
        try:
            if self.media_fields and _media_changes(obj, self.media_fields, self.options.base_dir):
                row = reference_row(body)  # exact integers, original key order
                _media_changes(row, self.media_fields, self.options.base_dir, apply=True)
                if self.index_key and self.index_key not in row:
                    row[self.index_key] = index
                return serialise_row(row)
        except RowError as exc:
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


def _media_changes(row: dict[str, Any], media_fields: list[str], base_dir: str, apply: bool = False) -> bool:
    changed = False
    for key in media_fields:
        value = row.get(key)
        if value is None:
            continue
        if type(value) is not list or not all(type(v) is str for v in value):
            raise RowError(f"{key!r} must be a list of strings or null, got {_describe(value)}")
        fixed = [_absolute(v, base_dir) for v in value]
        if fixed != value:
            changed = True
            if apply:
                row[key] = fixed
    return changed


def _absolute(value: str, base_dir: str) -> str:
    # Empty strings are left alone: there is no sensible absolute form, and the
    # operator that reads them reports the problem with its own context.
    if not value or os.path.isabs(value) or _URL.match(value):
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

    Output parsing is lenient where input parsing is strict (NaN, duplicate keys): it exists to catch torn or
    truncated files, not to re-judge what the recipe wrote.  Raises ValueError with ``file:line`` on a bad line or
    missing final newline.  ``sink`` receives the file's bytes in order, in blocks of whole lines (bytes or
    memoryviews), each after its lines were checked (merge copies while it validates: one read per shard).
    """
    digest = hashlib.sha256()
    rows = size = 0
    parser = simdjson.Parser()

    def hashed_chunks() -> Iterator[bytes]:  # runs on the reader thread: read + sha256 overlap parsing
        nonlocal size  # complete once the blocks are: the thread ends before the last block is handed on
        with fsio.open_read(path) as handle:
            while chunk := handle.read(READ_BYTES):
                digest.update(chunk)
                size += len(chunk)
                yield chunk

    framer = LineFramer()
    chunks = prefetch(hashed_chunks)
    try:
        for block in framer.blocks(chunks):
            lines = block.lines()
            for i, line in enumerate(lines):
                # simdjson validates without building the row (~4x orjson; helper processes, as the scans
                # use, measured no faster here); what it refuses (NaN, big integers, ...) the lenient reader decides.
                if not is_object(parser, line) and type(_lenient(line, f"{display}:{rows + i + 1}")) is not dict:
                    raise ValueError(f"{display}:{rows + i + 1}: not a JSON object")
            rows += len(lines)
            if sink is not None:
                sink(block.view())
    finally:
        chunks.close()
    if framer.tail is not None:
        raise ValueError(f"{display}:{rows + 1}: last line has no newline (truncated?)")
    return rows, size, digest.hexdigest()


def _lenient(line: bytes, where: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
