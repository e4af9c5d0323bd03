"""Plan a job's shards without passing over its data: the inputs, in order, as one byte stream cut into
``num_shards`` contiguous shards at line ends, each a list of spans (``ShardSpan``).  The rules:
docs/input-format.md, "Planning, scanning and reading shards".
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic.errors import ConfigError, InputChangedError, InputError
from data_juicer_elastic.jobdir.layout import shard_id
from data_juicer_elastic.jobdir.records import PlannedShard, ShardSpan
from data_juicer_elastic.rows.codecs import Codec, input_codec
from data_juicer_elastic.settings import InputOrder
from data_juicer_elastic.sharedfs import fsio

EXACT_BYTES_PER_CUT: Final = 1024 * 1024  # read everything while that costs at most this per cut
_PROBE_BYTES: Final = 64 * 1024  # one read while looking for the end of a line


@dataclass(frozen=True)
class InputItem:
    path: Path  # absolute
    relpath: str  # POSIX, relative to the dataset root (file name for one file)
    codec: Codec


@dataclass(frozen=True)
class _Unit:
    """A non-empty input file in the stream: bytes ``[start, start + size)``."""

    input: int  # index into the plan's inputs
    path: Path
    start: int
    size: int
    compressed: bool

    @property
    def end(self) -> int:
        return self.start + self.size


def plan_shards(
    inputs: list[InputItem], sizes: list[int], n: int, max_line_bytes: int
) -> tuple[list[PlannedShard], int]:
    """``n`` shards over ``inputs`` (stored ``sizes``, as listed), and the bytes read to place the cuts."""
    units, start = [], 0
    for index, (item, size) in enumerate(zip(inputs, sizes, strict=True)):
        if size > 0:
            units.append(_Unit(index, item.path, start, size, item.codec != "none"))
            start += size
    total = start
    if total == 0:
        where = str(inputs[0].path) if len(inputs) == 1 else str(inputs[0].path.parent)
        raise InputError("the input holds no rows", where=where, hint="point dataset_path at non-empty JSONL")
    plain = sum(u.size for u in units if not u.compressed)
    if n == 1:
        cuts, read = [], 0
    elif plain <= (n - 1) * EXACT_BYTES_PER_CUT and (cut := _exact_cuts(units, total, n)) is not None:
        cuts, read = cut
    else:
        cuts, read = _near_cuts(units, total, n, max_line_bytes)
    bounds = [0, *cuts, total]
    shards = []
    for k in range(n):
        spans = _spans(units, bounds[k], bounds[k + 1])
        shards.append(PlannedShard(shard_id(k, n), k, spans, sum(s.length for s in spans)))
    return shards, read


def _spans(units: list[_Unit], lo: int, hi: int) -> list[ShardSpan]:
    spans = []
    for unit in units:
        a, b = max(lo, unit.start), min(hi, unit.end)
        if a < b:
            spans.append(ShardSpan(unit.input, a - unit.start, b - a))
    return spans


# -- large inputs: one short read per cut ----------------------------------------------------------
def _near_cuts(units: list[_Unit], total: int, n: int, max_line_bytes: int) -> tuple[list[int], int]:
    starts = [u.start for u in units]
    cuts, read, last = [], 0, 0
    for k in range(1, n):
        target = total * k // n
        unit = units[bisect.bisect_right(starts, target) - 1]
        if target == unit.start:  # the target is where a file begins: a line end already
            cut = target
        elif unit.compressed:  # never cut: the nearer end of the file (ties: before it)
            cut = unit.start if target - unit.start <= unit.end - target else unit.end
        else:
            cut, spent = _line_end_after(unit, target, max_line_bytes)
            read += spent
        last = max(last, cut)  # a unit longer than a share leaves the next shard empty
        cuts.append(last)
    return cuts, read


def _line_end_after(unit: _Unit, target: int, max_line_bytes: int) -> tuple[int, int]:
    """(stream offset just past the newline that ends the line holding byte ``target``, bytes read).  The file's
    end when there is none within ``max_line_bytes`` (that line is refused by its scan)."""
    local = target - unit.start  # 0 < local < size: target is inside the file, past its first byte
    spent = 0
    with fsio.open_read(unit.path) as handle:
        handle.seek(local - 1)  # the line holding `target` may end exactly at target - 1
        position = local - 1
        while spent <= max_line_bytes + 1:
            block = handle.read(_PROBE_BYTES)
            if not block:
                return unit.end, spent
            spent += len(block)
            newline = block.find(b"\n")
            if newline >= 0:
                return min(unit.start + position + newline + 1, unit.end), spent
            position += len(block)
    return unit.end, spent


# -- small inputs: every line end known ---------------------------------------------------------------
def _exact_cuts(units: list[_Unit], total: int, n: int) -> tuple[list[int], int] | None:
    """The cuts by the row rule, or None when compressed files make the pieces too few to give every shard one
    (then the cuts go near their targets, some shards left empty)."""
    ends, read, compressed = [], 0, 0
    for unit in units:
        if unit.compressed:
            ends.append(unit.end)
            compressed += 1
            continue
        offset = 0
        for chunk in fsio.iter_chunks(unit.path):
            read += len(chunk)
            at = chunk.find(b"\n")
            while at >= 0:
                ends.append(unit.start + offset + at + 1)
                at = chunk.find(b"\n", at + 1)
            offset += len(chunk)
        if offset != unit.size:
            raise InputChangedError(
                f"input changed while it was planned: {unit.size} bytes listed, {offset} read",
                where=str(unit.path),
                hint="stop whatever writes the input and prepare again",
            )
        if not ends or ends[-1] != unit.end:
            ends.append(unit.end)  # a last line without its newline
    if n > len(ends):
        if compressed:
            return None  # a compressed file's rows are not counted here: cut near the targets instead
        raise ConfigError(
            f"num_shards={n} is more than the {len(ends)} input rows",
            where="num_shards",
            hint=f"use at most {len(ends)} shards",
        )
    return _row_rule(ends, total, n), read


def _row_rule(ends: list[int], total: int, n: int) -> list[int]:
    """The cuts of the full-split rule over pieces ending at ``ends``: shard ``k`` ends at the piece end nearest
    its target ``total*(k+1)/n`` (ties: before the piece that straddles it), never empty, and early enough that
    every later shard still gets a piece.  Exact integer arithmetic."""
    cuts: list[int] = []
    k = taken = cum = 0
    for seen, end in enumerate(ends):
        size = end - cum
        if taken and k < n - 1:
            t = total * (k + 1)  # the target times n
            must_close = len(ends) - seen == n - 1 - k
            nearer = n * (cum + size) > t and 2 * t <= n * (2 * cum + size)
            if must_close or nearer:
                cuts.append(cum)
                k += 1
                taken = 0
        taken += 1
        cum = end
    return cuts


# -- the inputs ----------------------------------------------------------------------------------------
def added_inputs_note(dataset_path: str, planned: Iterable[Any]) -> str | None:
    """What a finished run's summary and ``verify`` say of the files a directory input holds now that
    its plan (``planned``: the inputs, each with a ``relpath``) did not list: added after planning, so
    no shard read them.  None when there are none, for a file input, or a directory gone or emptied
    (a run refuses a changed input itself; this only says what a finished job left out)."""
    dataset = Path(dataset_path)
    if not dataset.is_dir():
        return None
    try:
        found = discover_inputs(dataset)
    except (InputError, OSError):
        return None
    known = {item.relpath for item in planned}
    added = [item.relpath for item in found if item.relpath not in known]
    if not added:
        return None
    shown = ", ".join(added[:3]) + (", ..." if len(added) > 3 else "")
    return (
        f"{len(added)} file(s) added to {dataset_path} after planning were not processed ({shown}): "
        "a new job_dir plans them"
    )


def discover_inputs(dataset: Path, order: InputOrder = "sorted") -> list[InputItem]:
    """One file, or every ``*.jsonl``/``*.jsonl.gz``/``*.jsonl.zst`` below a directory, sorted by relative POSIX
    path (the same on every filesystem), or in Data-Juicer's order (``"data_juicer"``)."""
    if dataset.is_file():
        # A single file is JSONL whatever its name; only a .gz/.zst ending chooses a decoder.
        codec = input_codec(dataset.name) or {".gz": "gzip", ".zst": "zstd"}.get(dataset.suffix, "none")
        return [InputItem(dataset, dataset.name, codec)]
    found: list[InputItem] = []
    # os.walk without following directory symlinks: the order and the set of files
    # must not depend on link loops; linked *files* are read like any file.
    for root, dirs, files in os.walk(dataset):
        dirs.sort()
        for name in files:
            codec = input_codec(name)
            if codec is not None:
                path = Path(root) / name
                found.append(InputItem(path, path.relative_to(dataset).as_posix(), codec))
    found.sort(key=lambda item: item.relpath)
    if order == "data_juicer":
        found = data_juicer_order(dataset, found)
    elif order != "sorted":
        raise ConfigError(f"unknown input order {order!r}", where="input_order", hint="use sorted or data_juicer")
    if not found:
        raise InputError(
            "no *.jsonl, *.jsonl.gz or *.jsonl.zst files found",
            where=str(dataset),
            hint="directory inputs are searched recursively",
        )
    return found


def data_juicer_order(dataset: Path, found: list[InputItem]) -> list[InputItem]:
    """``found`` in the order of Data-Juicer 1.6.1's default executor: ``Path.rglob("*")`` (the filesystem's own
    order, which can differ between copies of the same files), grouped by suffix (groups in order of their first
    file; ``utils/file_utils.find_files_with_suffix``)."""
    by_path = {item.path: item for item in found}
    groups: dict[str, list[InputItem]] = {}
    for path in dataset.rglob("*"):
        item = by_path.get(path)
        if item is not None:
            key = "".join(s.lower() for s in path.suffixes[-2:]) if item.codec != "none" else path.suffix.lower()
            groups.setdefault(key, []).append(item)
    return [item for group in groups.values() for item in group]
