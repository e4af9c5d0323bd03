"""``manifest-rows.json``: what a display needs of the manifest, in a small record beside it.

A 100,000-shard manifest is 38 MB of JSON: decoding it (and checking its checksum) is most of
what ``dj-elastic status`` costs.  Status needs of each shard only its id (derived from its
index), its rows and its span bytes.  The manifest's publisher (``jobdir.scans.publish_manifest``)
writes this record once the manifest is in place: the manifest less its shards (the head), the
shards' rows and span bytes as two lists, and the sha256 of the manifest file's bytes, under its
own checksum (0.6 MB at 99,999 shards).

A reader still reads the manifest's bytes, but only hashes them (a few tens of ms instead of
most of a second to decode): it trusts the record only when its checksum matches, it names the
job its head names, and it was made from exactly these bytes.  Anything else (missing,
unreadable, damaged, made from another manifest) and the reader decodes the manifest itself,
whose errors it then reports.  Workers, merge and verify never read it: they validate the full
manifest.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any, Final, NamedTuple

import orjson

from data_juicer_elastic.errors import ConfigError, JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout, shard_ids
from data_juicer_elastic.jobdir.records import FORMAT_PREFIX, VERSION, Manifest, ShardSpan
from data_juicer_elastic.sharedfs import fsio

RECORD_FORMAT: Final = FORMAT_PREFIX + "manifest-rows"
MAX_MANIFEST_BYTES: Final = 256 * 1024 * 1024  # 100k shards + a large recipe stay far below
MAX_ROWS_RECORD_BYTES: Final = 64 * 1024 * 1024  # 99,999 shards: 0.6 MB


class ShardRow(NamedTuple):
    """What a read-only display needs of a shard's manifest entry (``load_manifest(entries=False)``)."""

    shard_id: str
    index: int
    rows: int
    span_bytes: int  # the sum of its spans' lengths (the stored bytes it reads)

    @property
    def spans(self) -> list[ShardSpan]:
        """One span of the shard's bytes, for what sums span lengths (status's scan line)."""
        return [ShardSpan(0, 0, self.span_bytes)]


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def encode_rows_record(manifest_bytes: bytes) -> bytes:
    """The record of the manifest file of these bytes."""
    obj = orjson.loads(manifest_bytes)
    shards = obj["shards"]
    body = {
        "format": RECORD_FORMAT,
        "version": VERSION,
        "job_id": obj["job_id"],
        "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
        "head": {key: value for key, value in obj.items() if key != "shards"},
        "rows": [e["rows"] for e in shards],
        "span_bytes": [sum(span["length"] for span in e["spans"]) for e in shards],
    }
    return orjson.dumps({**body, "checksum": _checksum(body)})


def publish_rows_record(layout: JobLayout) -> None:
    """Write the record of the published manifest (first wins: every publisher derives the same
    bytes from the same file).  Best effort: without it a reader decodes the manifest itself."""
    try:
        data = fsio.read_record(layout.manifest, MAX_MANIFEST_BYTES)
        if data is not None:
            fsio.publish_bytes(layout.manifest_rows, encode_rows_record(data))
    except OSError:
        pass  # e.g. a full disk: the job is prepared all the same; status decodes the manifest


def read_rows_record(layout: JobLayout) -> Manifest | None:
    """The manifest with :class:`ShardRow` shards from the record, or None when it is missing or
    was not made from the bytes of ``manifest.json`` as it is now (hashed as they are read, never
    held whole: the caller then reads and decodes the manifest itself)."""
    try:
        data = fsio.read_record(layout.manifest_rows, MAX_ROWS_RECORD_BYTES)
        if data is None:
            return None
        obj = orjson.loads(data)
        body = {key: value for key, value in obj.items() if key != "checksum"}
        if obj.get("format") != RECORD_FORMAT or obj.get("version") != VERSION or _checksum(body) != obj["checksum"]:
            return None
        if obj["manifest_sha256"] != fsio.file_sha256(layout.manifest)[1]:
            return None
        head = Manifest.from_object({**obj["head"], "shards": []}, str(layout.manifest))
        rows, spans = obj["rows"], obj["span_bytes"]
        n = head.num_shards
        if head.job_id != obj["job_id"] or len(rows) != n or len(spans) != n:
            return None
        new_row = tuple.__new__  # ShardRow's own __new__ is a Python call per shard
        shards = [new_row(ShardRow, item) for item in zip(shard_ids(n), range(n), rows, spans, strict=True)]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError, JobDirError, ConfigError):
        return None
    return replace(head, shards=shards)  # type: ignore[arg-type]  # ShardRow: the fields a display reads
