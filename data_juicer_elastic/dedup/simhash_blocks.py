"""SimHash near pairs by the block method ``simhash.find_all`` (simhash-pybind) uses, as bands.

The 64 bits are cut into ``num_blocks`` contiguous blocks (block ``i``: bits ``64*i//num_blocks`` up to
``64*(i+1)//num_blocks``).  Two values at most ``distance`` bits apart differ in at most ``distance``
blocks, so they agree on at least ``num_blocks - distance`` of them: every such pair shares the chosen
blocks of at least one combination of ``num_blocks - distance`` blocks (15 combinations for Data-Juicer's
6 blocks and distance 4).  Each combination is one band: its key is the value masked to those blocks,
and within a key every pair of distinct values is compared (``pairs_within``).  ``find_all`` permutes
the blocks to the front and sorts; masking finds the same groups and so the same pairs: all pairs of
distinct values within ``distance`` bits, none missed (num_blocks > distance), none extra (compared).
"""

from __future__ import annotations

import itertools

import numpy as np

BITS = 64
_SMALL_GROUP = 16  # groups up to this many distinct values are compared by shifted views


def band_masks(num_blocks: int, distance: int) -> list[int]:
    """One mask per combination of ``num_blocks - distance`` blocks, in ``itertools.combinations`` order."""
    if not 0 < num_blocks <= BITS or not 0 <= distance < num_blocks:
        raise ValueError(f"num_blocks {num_blocks} must be in 1..64 and greater than hamming_distance {distance}")
    blocks = [
        sum(1 << bit for bit in range(i * BITS // num_blocks, (i + 1) * BITS // num_blocks)) for i in range(num_blocks)
    ]
    return [sum(choice) for choice in itertools.combinations(blocks, num_blocks - distance)]


def simhash_keys(values: np.ndarray, num_blocks: int, distance: int) -> np.ndarray:
    """``(rows, bands, 2)`` keys: the value masked to the band's blocks, then the value."""
    values = np.asarray(values, dtype=np.uint64)
    masks = np.array(band_masks(num_blocks, distance), dtype=np.uint64)
    out = np.empty((len(values), len(masks), 2), dtype=np.uint64)
    out[:, :, 0] = values[:, None] & masks[None, :]
    out[:, :, 1] = values[:, None]
    return out


def pairs_within(groups: np.ndarray, values: np.ndarray, distance: int) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs ``(i, j)``, ``i < j``, of entries in the same group whose values are at most ``distance``
    bits apart.  ``groups`` is sorted; ``values`` are distinct within a group.  Small groups are compared
    by shifted views (linear in the entries per shift), large ones pairwise in blocks (quadratic in the
    group, as ``find_all`` is)."""
    n = len(values)
    left, right = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    if n < 2:
        return left[0], right[0]
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    sizes = np.diff(np.r_[starts, n])
    for shift in range(1, min(int(sizes.max()), _SMALL_GROUP + 1)):
        i = np.arange(n - shift)
        same = groups[i] == groups[i + shift]
        i = i[same]
        near = np.bitwise_count(values[i] ^ values[i + shift]) <= distance
        left.append(i[near])
        right.append(i[near] + shift)
    for start, size in zip(starts[sizes > _SMALL_GROUP + 1], sizes[sizes > _SMALL_GROUP + 1], strict=True):
        block = values[start : start + size]
        for at in range(0, size, 1024):
            rows = block[at : at + 1024]
            a, b = np.nonzero(np.bitwise_count(rows[:, None] ^ block[None, :]) <= distance)
            a = a + at
            far = b - a > _SMALL_GROUP  # the shifted views found the close ones
            left.append(start + a[far])
            right.append(start + b[far])
    return np.concatenate(left).astype(np.int64), np.concatenate(right).astype(np.int64)
