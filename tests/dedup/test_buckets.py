"""Bucket tasks: balanced ranges that cover every key once; star edges (linear in a hot key); SimHash
pairs by blocks equal to a brute-force Hamming search."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.dedup import buckets, signatures, simhash_blocks
from data_juicer_elastic.errors import IntegrityError
from tests.dedup.pipeline import kept_rows


def test_ranges_cover_every_key_once_and_are_balanced():
    rng = np.random.default_rng(1)
    samples = [(sorted(rng.integers(0, 1 << 64, 64, dtype=np.uint64).tolist()), 10_000) for _ in range(8)]
    ranges = buckets.plan_ranges(samples, 16)
    assert ranges[0][0] == 0 and ranges[-1][1] is None
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    keys = rng.integers(0, 1 << 64, 100_000, dtype=np.uint64)
    counts = [int(((keys >= low) & (True if high is None else keys < np.uint64(high))).sum()) for low, high in ranges]
    assert sum(counts) == len(keys) and len(ranges) == 16
    assert max(counts) < 2 * len(keys) / 16


def test_one_range_without_samples_or_tasks():
    assert buckets.plan_ranges([], 8) == [(0, None)]
    assert buckets.plan_ranges([([5, 9], 2)], 1) == [(0, None)]


def entries(rows_keys):
    out = np.empty(len(rows_keys), dtype=[(f, "<u8") for f in ("key", "key2", "row")])
    out["key"] = [k for k, _, _ in rows_keys]
    out["key2"] = [k2 for _, k2, _ in rows_keys]
    out["row"] = [r for _, _, r in rows_keys]
    return out[np.lexsort((out["row"], out["key2"], out["key"]))]


def test_a_hot_key_costs_one_edge_per_member():
    hot = entries([(7, 7, row) for row in range(50_000)] + [(8, 1, 3), (8, 2, 4)])
    edges = buckets.bucket_edges(hot, "minhash")
    assert len(edges) == 49_999 and set(edges["root"].tolist()) == {0}
    assert (edges["row"] > edges["root"]).all()


def test_simhash_edges_join_same_values_in_band_zero_and_near_values_in_every_band():
    values = [(0b1111, 0, 5), (0b1111, 0, 9), (0b1111, 0b1, 2), (0b1111, 0b111111111, 1)]
    sorted_entries = entries(values)
    band0 = buckets.bucket_edges(sorted_entries, "simhash", band=0, distance=1)
    assert sorted(map(tuple, band0.tolist())) == [(5, 2), (9, 5)]
    band3 = buckets.bucket_edges(sorted_entries, "simhash", band=3, distance=1)
    assert sorted(map(tuple, band3.tolist())) == [(5, 2)]


def test_band_masks_match_simhash_pybind_defaults():
    masks = simhash_blocks.band_masks(6, 4)
    assert len(masks) == 15 and all(bin(m).count("1") in (20, 21, 22) for m in masks)
    with pytest.raises(ValueError, match="greater than"):
        simhash_blocks.band_masks(4, 4)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, (1 << 64) - 1), min_size=1, max_size=80, unique=True),
    st.integers(0, 6),
    st.data(),
)
def test_block_bands_find_exactly_the_pairs_within_the_distance(values, distance, data):
    # near copies: flip a few bits of some values
    more = [v ^ (1 << bit) for v in values[:10] for bit in data.draw(st.lists(st.integers(0, 63), max_size=3))]
    values = sorted(set(values + more))
    num_blocks = distance + data.draw(st.integers(1, 3))
    expected = {(a, b) for i, a in enumerate(values) for b in values[i + 1 :] if bin(a ^ b).count("1") <= distance}
    found = set()
    arr = np.array(values, dtype=np.uint64)
    for mask in simhash_blocks.band_masks(num_blocks, distance):
        keys = arr & np.uint64(mask)
        order = np.lexsort((arr, keys))
        left, right = simhash_blocks.pairs_within(keys[order], arr[order], distance)
        found |= {tuple(sorted((int(arr[order][i]), int(arr[order][j])))) for i, j in zip(left, right, strict=False)}
    assert found == expected


def test_a_large_group_is_compared_pairwise():
    rng = np.random.default_rng(3)
    base = int(rng.integers(0, 1 << 63))
    values = sorted({base ^ (1 << int(b)) ^ (1 << int(c)) for b, c in rng.integers(0, 64, (300, 2))})
    arr = np.array(values, dtype=np.uint64)
    left, right = simhash_blocks.pairs_within(np.zeros(len(arr), np.uint64), arr, 2)
    expected = sum(1 for i, a in enumerate(values) for b in values[i + 1 :] if bin(a ^ b).count("1") <= 2)
    assert len(set(zip(left.tolist(), right.tolist(), strict=False))) == len(left) == expected


@pytest.mark.parametrize("num_shards", [1, 3, 10])
def test_the_kept_rows_do_not_depend_on_the_task_split_or_order(tmp_path, num_shards):
    rng = np.random.default_rng(num_shards)
    keys = rng.integers(0, 6, (40, 4, 2)).astype(np.uint64)  # many collisions across bands
    runs = {
        kept_tuple
        for tasks, reverse in [(1, False), (2, True), (5, False), (9, True)]
        for kept_tuple in [
            tuple(
                kept_rows(
                    tmp_path / f"{tasks}-{reverse}",
                    keys,
                    num_shards,
                    "minhash",
                    tasks_per_band=tasks,
                    reverse_tasks=reverse,
                )
            )
        ]
    }
    assert len(runs) == 1


@pytest.mark.parametrize("num_shards", [1, 4])
def test_a_group_of_one_range_of_every_band_keeps_the_rows_single_tasks_keep(tmp_path, num_shards):
    rng = np.random.default_rng(num_shards + 10)
    keys = rng.integers(0, 5, (50, 6, 2)).astype(np.uint64)
    single = kept_rows(tmp_path / "single", keys, num_shards, "minhash", tasks_per_band=3)
    assert kept_rows(tmp_path / "grouped", keys, num_shards, "minhash", tasks_per_band=3, grouped=True) == single


def test_groups_hold_the_same_range_number_of_every_band(tmp_path):
    keys = np.random.default_rng(4).integers(0, 1 << 62, (200, 4, 2)).astype(np.uint64)
    kept_rows(tmp_path, keys, 2, "minhash")
    readers = [signatures.open_signatures(p, identity="recipe-a/stage-1") for p in sorted((tmp_path / "sig").iterdir())]
    groups = buckets.bucket_groups(readers, 3)
    assert len(groups) == 3 and all(sorted(t.band for t in g) == [0, 1, 2, 3] for g in groups)
    assert all(t.low == 0 for t in groups[0]) and all(t.high is None for t in groups[-1])


def test_an_edge_file_of_another_task_is_refused(tmp_path):
    keys = np.random.default_rng(4).integers(0, 3, (20, 2, 2)).astype(np.uint64)
    kept_rows(tmp_path, keys, 2, "minhash", tasks_per_band=1)
    readers = [signatures.open_signatures(p, identity="recipe-a/stage-1") for p in sorted((tmp_path / "sig").iterdir())]
    band0, band1 = buckets.bucket_tasks(readers, 1)
    with pytest.raises(IntegrityError, match="two bucket tasks"):
        buckets.run_bucket(
            band1, readers, tmp_path / "edges" / f"{band0.name}.edges", identity="recipe-a/stage-1", method="minhash"
        )


def test_a_job_of_only_short_documents_is_one_cluster_at_linear_cost(tmp_path):
    """Every document shorter than the window has the same MinHash signature: 20,000 rows in 7 shards
    collide in every band; the edges are one per row and band (not pairs), and only row 0 is kept."""
    keys = np.full((20_000, 25, 2), 7, dtype=np.uint64)
    assert kept_rows(tmp_path, keys, 7, "minhash", tasks_per_band=4, block_entries=4096) == [0]
    edge_files = list((tmp_path / "edges").iterdir())
    edges = sum(buckets.open_edges(p, identity="recipe-a/stage-1").section("edges").count for p in edge_files)
    assert edges == 25 * (20_000 - 1)
