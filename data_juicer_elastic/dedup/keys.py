"""Global row ids and bucket keys: what the deduplication phases know of a row.

A row's *global row id* is ``(shard << ROW_BITS) | row`` with ``row`` its input row number within its
shard (carried through the operators in ``rows.row_schema.ROW_COLUMN``): shards are numbered in input
order, so the ids sort in input order without a prefix sum over the shards (the cluster step makes them
dense from every shard's input row count).  The rows that reach a stage are a subsequence of a shard's
input rows; the others simply have no entries.

A row's *keys* are derived from the hash column the Data-Juicer operator's own ``compute_hash`` wrote
(never recomputed here), as two uint64 (``key``, ``key2``) per band:

- exact (``__dj__hash``, an md5 hex string): the 16 bytes of the md5 themselves; one band;
- MinHash (``__dj__minhash``, one bytes value per band): a 128-bit blake2b digest of the band's bytes
  (a band is ``8 * num_rows_per_band`` bytes; two different bands collide with probability 2**-128);
- SimHash (``__dj__simhash``, a decimal uint64 string): the value itself, in ``key2``; the bands of
  ``dedup.simhash_blocks`` put the value's chosen blocks in ``key``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

import numpy as np

ROW_BITS: Final = 40  # up to 2**40 rows per shard, 2**24 shards
ROW_MASK: Final = (1 << ROW_BITS) - 1
MAX_SHARDS: Final = 1 << (64 - ROW_BITS)


def global_rows(shard: int, rows: int) -> np.ndarray:
    """The global row ids of a shard's first ``rows`` stage rows."""
    if not 0 <= shard < MAX_SHARDS or rows > ROW_MASK + 1:
        raise ValueError(f"shard {shard} with {rows} rows is outside the global row id space")
    return np.uint64(shard << ROW_BITS) + np.arange(rows, dtype=np.uint64)


def global_ids(shard: int, rows: np.ndarray, input_rows: int) -> np.ndarray:
    """The global row ids of a shard's rows ``rows`` (input row numbers, strictly increasing, below
    ``input_rows``)."""
    rows = np.asarray(rows, dtype=np.uint64)
    if not 0 <= shard < MAX_SHARDS or input_rows > ROW_MASK + 1:
        raise ValueError(f"shard {shard} with {input_rows} rows is outside the global row id space")
    if rows.ndim != 1 or (len(rows) and int(rows[-1]) >= input_rows):
        raise ValueError(f"shard {shard}: row numbers must be a 1-d array below its {input_rows} input rows")
    if len(rows) > 1 and not bool((rows[1:] > rows[:-1]).all()):
        raise ValueError(f"shard {shard}: row numbers must be strictly increasing (input order)")
    return np.uint64(shard << ROW_BITS) | rows


def shard_of(ids: np.ndarray) -> np.ndarray:
    return (np.asarray(ids, dtype=np.uint64) >> np.uint64(ROW_BITS)).astype(np.int64)


def row_of(ids: np.ndarray) -> np.ndarray:
    return (np.asarray(ids, dtype=np.uint64) & np.uint64(ROW_MASK)).astype(np.int64)


def _as_keys(digests: bytes, rows: int, bands: int) -> np.ndarray:
    """``(rows, bands, 2)`` uint64 keys from 16-byte digests laid end to end (big-endian halves)."""
    return np.frombuffer(digests, dtype=">u8").astype(np.uint64).reshape(rows, bands, 2)


def _exact_digest(value: str) -> bytes:
    if len(value) == 32:
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    return hashlib.blake2b(value.encode(), digest_size=16, person=b"dj-exact").digest()


def exact_keys(hashes: Sequence[str]) -> np.ndarray:
    """``(rows, 1, 2)`` uint64 keys of ``__dj__hash`` values (an md5 hex string's 16 bytes; any other
    string, a 128-bit blake2b digest of it)."""
    return _as_keys(b"".join(_exact_digest(value) for value in hashes), len(hashes), 1)


def minhash_keys(bands: Sequence[Sequence[bytes]]) -> np.ndarray:
    """``(rows, bands, 2)`` uint64 keys of ``__dj__minhash`` values (one bytes value per band)."""
    width = len(bands[0]) if len(bands) else 0
    digests = []
    for index, row in enumerate(bands):
        if len(row) != width:
            raise ValueError(f"row {index} has {len(row)} MinHash bands, the first row {width}")
        digests += [hashlib.blake2b(value, digest_size=16).digest() for value in row]
    return _as_keys(b"".join(digests), len(bands), width)


def simhash_values(hashes: Sequence[str | int]) -> np.ndarray:
    """The uint64 values of ``__dj__simhash`` (decimal strings, as the operator stores them)."""
    return np.fromiter((int(value) for value in hashes), dtype=np.uint64, count=len(hashes))
