"""The one file format every deduplication phase writes: a checksummed table of sorted sections.

A table is one numpy structured array (every field ``<u8``) cut into named sections, each sorted by
its first field, each stored in blocks of at most ``block_entries`` entries.  Each section's index holds
a sample of its first field (the bucket plan's quantiles) and, per block, the block's first value (the
sparse index a range read seeks by) and its sha256.  So a
reader of a key range reads and checks only the blocks that can hold it, never the whole file, and a
truncated, tampered or foreign file is refused (``errors.IntegrityError``) before any of its entries
is used.

Layout: ``MAGIC`` | header length (u64 LE) | header JSON | sha256 of the header JSON | one index per
section (JSON: block firsts, block sha256s, sample; its own sha256 in the header) | entries.  The header
is small (~150 bytes a section); a reader loads a section's index only when it uses that section.
Published like every job-directory result: a private temp file, fsync, then ``fsio.publish_exclusive``
(link: first wins; a second publisher of the same bytes is told it is there).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.fsio import BufferedCheckedWriter

MAGIC: Final = b"DJEDTBL1"
FORMAT: Final = 1
BLOCK_ENTRIES: Final = 1 << 16  # 64 Ki entries: 1.5 MiB of signature entries per checked read
SAMPLE_SIZE: Final = 64  # evenly spaced first-field values per section, for the bucket plan
MAX_HEADER_BYTES: Final = 64 * 1024 * 1024
# The first read of a table: its header (~150 bytes a section) and what follows (the first indexes).  A
# bucket task of one band needs one index: a larger first read would carry every band's, more bytes
# than a second read costs (a bucket group asks for more: ``signatures.GROUP_HEAD_READ``).
HEAD_READ: Final = 8 * 1024
_PREFIX: Final = struct.Struct("<8sQ")


def table_dtype(fields: Sequence[str]) -> np.dtype:
    """The entry type of a table: one little-endian uint64 per field."""
    return np.dtype([(name, "<u8") for name in fields])


@dataclass(frozen=True)
class Section:
    name: str
    start: int  # entry offset in the table
    count: int
    firsts: tuple[int, ...]  # the first-field value that opens each block
    digests: tuple[str, ...]  # sha256 of each block's bytes
    sample: tuple[int, ...]  # evenly spaced first-field values, sorted


def _sample(column: np.ndarray) -> list[int]:
    if len(column) <= SAMPLE_SIZE:
        return [int(v) for v in column]
    picks = np.linspace(0, len(column) - 1, SAMPLE_SIZE).astype(np.int64)
    return [int(v) for v in column[picks]]


def write_table(
    path: Path,
    *,
    kind: str,
    identity: str,
    fields: Sequence[str],
    sections: Sequence[tuple[str, np.ndarray]],
    meta: dict | None = None,
    block_entries: int = BLOCK_ENTRIES,
) -> bool:
    """Publish a table at ``path``: True when ``path`` now holds these bytes (ours, or the same bytes a
    rerun published first), False when another, different file is already there.  Every section
    must already be sorted by its first field (checked: a wrong order would make range reads miss)."""
    dtype = table_dtype(fields)
    described, indexes, blocks, start, index_at = [], [], [], 0, 0
    for name, entries in sections:
        entries = np.ascontiguousarray(entries, dtype=dtype)
        first = entries[fields[0]]
        if len(first) > 1 and bool(np.any(first[1:] < first[:-1])):
            raise ValueError(f"section {name} of {path} is not sorted by {fields[0]}")
        firsts, digests = [], []
        for at in range(0, len(entries), block_entries):
            block = entries[at : at + block_entries]
            firsts.append(int(block[fields[0]][0]))
            digests.append(hashlib.sha256(block.tobytes()).hexdigest())
            blocks.append(block)
        index = json.dumps({"firsts": firsts, "digests": digests, "sample": _sample(first)}).encode()
        described.append(
            {
                "name": name,
                "start": start,
                "count": len(entries),
                "index_at": index_at,
                "index_bytes": len(index),
                "index_sha256": hashlib.sha256(index).hexdigest(),
            }
        )
        indexes.append(index)
        start += len(entries)
        index_at += len(index)
    header = json.dumps(
        {
            "format": FORMAT,
            "kind": kind,
            "identity": identity,
            "fields": list(fields),
            "entries": start,
            "block_entries": block_entries,
            "index_bytes": index_at,
            "sections": described,
            "meta": meta or {},
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    path = Path(path)
    tmp = fsio.temp_path_for(path)
    size = _PREFIX.size + len(header) + 32 + index_at + start * dtype.itemsize
    writer = BufferedCheckedWriter(tmp, size_hint=size)
    try:
        writer.write(_PREFIX.pack(MAGIC, len(header)) + header + hashlib.sha256(header).digest() + b"".join(indexes))
        for block in blocks:
            writer.write(memoryview(block).cast("B"))
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    try:
        return fsio.publish_exclusive(tmp, path)
    finally:
        fsio.remove(tmp)


def publish_table(path: Path, **table) -> TableReader:
    """Publish a table (``write_table``'s arguments) and return it opened: the first valid table at
    ``path`` wins (a rerun's identical bytes, or another attempt's table of the same kind and identity
    whose every block checks); one that is refused (truncated, tampered, foreign) is removed and this
    one published."""
    for _ in range(3):
        if write_table(path, **table):
            return TableReader(path, kind=table["kind"], identity=table["identity"])
        try:  # other bytes are there: kept only if every block of it checks (rare: outputs are deterministic)
            found = TableReader(path, kind=table["kind"], identity=table["identity"])
            found.verify()
            return found
        except IntegrityError:
            fsio.remove(path)
    raise IntegrityError("could not be published (refused three times)", where=str(path))


class TableReader:
    """One published table, its header checked; entries read by block, each block checked."""

    def __init__(self, path: Path, *, kind: str, identity: str, head_read: int = HEAD_READ):
        """``head_read``: the bytes of the first read (a reader of every section: enough for every index)."""
        self.path = Path(path)
        with fsio.open_read(self.path) as handle:
            head = handle.read(max(head_read, _PREFIX.size))
            if len(head) < _PREFIX.size:
                raise self._refused("truncated (no header)")
            magic, length = _PREFIX.unpack(head[: _PREFIX.size])
            if magic != MAGIC:
                raise self._refused("not a dj-elastic deduplication table")
            if length > MAX_HEADER_BYTES:
                raise self._refused(f"header of {length} bytes; corrupt")
            if len(head) < _PREFIX.size + length + 32:
                head += handle.read(_PREFIX.size + length + 32 - len(head))
            header = head[_PREFIX.size : _PREFIX.size + length]
            digest = head[_PREFIX.size + length : _PREFIX.size + length + 32]
            handle.seek(0, 2)
            size = handle.tell()
        self._head = head
        if len(header) < length or len(digest) < 32:
            raise self._refused("truncated (header)")
        if hashlib.sha256(header).digest() != digest:
            raise self._refused("header checksum mismatch (tampered or corrupt)")
        record = json.loads(header)
        if record.get("format") != FORMAT or record.get("kind") != kind:
            raise self._refused(f"holds {record.get('kind')!r} (format {record.get('format')}), not {kind!r}")
        if record.get("identity") != identity:
            raise self._refused(
                f"was written for {record.get('identity')!r}, not {identity!r} (a different recipe or stage)"
            )
        self.kind = kind
        self.fields: list[str] = record["fields"]
        self.dtype = table_dtype(self.fields)
        self.entries: int = record["entries"]
        self.block_entries: int = record["block_entries"]
        self.meta: dict = record["meta"]
        self.index_offset = _PREFIX.size + length + 32
        self.data_offset = self.index_offset + record["index_bytes"]
        expected = self.data_offset + self.entries * self.dtype.itemsize
        if size != expected:
            raise self._refused(f"{size} bytes where its header says {expected} (truncated or appended to)")
        self._described = {s["name"]: s for s in record["sections"]}
        self._sections: dict[str, Section] = {}

    def _refused(self, why: str) -> IntegrityError:
        return IntegrityError(
            f"deduplication file refused: {why}", where=str(self.path), hint="remove it; its phase recomputes it"
        )

    @property
    def section_names(self) -> list[str]:
        return list(self._described)

    def section(self, name: str) -> Section:
        """A section with its block index, read (and checked) the first time it is asked for: a reader
        of one section never reads the others' indexes."""
        if name in self._sections:
            return self._sections[name]
        described = self._described.get(name)
        if described is None:
            raise self._refused(f"has no section {name!r}")
        at, length = self.index_offset + described["index_at"], described["index_bytes"]
        if at + length <= len(self._head):
            data = self._head[at : at + length]
        else:
            with fsio.open_read(self.path) as handle:
                handle.seek(at)
                data = handle.read(length)
        if hashlib.sha256(data).hexdigest() != described["index_sha256"]:
            raise self._refused(f"the index of section {name} fails its sha256 (tampered or corrupt)")
        index = json.loads(data)
        section = Section(
            name,
            described["start"],
            described["count"],
            tuple(index["firsts"]),
            tuple(index["digests"]),
            tuple(index["sample"]),
        )
        self._sections[name] = section
        return section

    def _blocks(self, section: Section, first: int, last: int) -> np.ndarray:
        """Blocks ``first`` .. ``last - 1`` of a section, each checked against its sha256."""
        if first >= last:
            return np.empty(0, dtype=self.dtype)
        begin = section.start + first * self.block_entries
        end = section.start + min(section.count, last * self.block_entries)
        with fsio.open_read(self.path) as handle:
            handle.seek(self.data_offset + begin * self.dtype.itemsize)
            data = handle.read((end - begin) * self.dtype.itemsize)
        if len(data) != (end - begin) * self.dtype.itemsize:
            raise self._refused("truncated while read")
        step = self.block_entries * self.dtype.itemsize
        for number, at in enumerate(range(0, len(data), step), first):
            if hashlib.sha256(data[at : at + step]).hexdigest() != section.digests[number]:
                raise self._refused(f"block {number} of section {section.name} fails its sha256 (tampered or corrupt)")
        return np.frombuffer(data, dtype=self.dtype)

    def read(self, name: str, low: int = 0, high: int | None = None) -> np.ndarray:
        """The entries of a section whose first field is in ``[low, high)`` (``high`` None: no bound),
        reading only the blocks that can hold them."""
        section = self.section(name)
        firsts = section.firsts
        first = max(0, bisect.bisect_left(firsts, low) - 1)  # equal values may end the block before
        last = len(firsts) if high is None else bisect.bisect_left(firsts, high)
        entries = self._blocks(section, first, last)
        column = entries[self.fields[0]]
        begin = int(np.searchsorted(column, np.uint64(low), "left"))
        end = len(column) if high is None else int(np.searchsorted(column, np.uint64(high), "left"))
        return entries[begin:end]

    def verify(self) -> None:
        """Read and check every section's index and blocks (raises ``errors.IntegrityError``)."""
        for name in self.section_names:
            for _ in self.iter_blocks(name):
                pass

    def iter_blocks(self, name: str, blocks_per_read: int = 16) -> Iterator[np.ndarray]:
        """The whole section, a few checked blocks at a time (bounded memory)."""
        section = self.section(name)
        for first in range(0, len(section.firsts), blocks_per_read):
            yield self._blocks(section, first, min(len(section.firsts), first + blocks_per_read))
