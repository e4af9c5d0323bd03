"""The cluster step: components labelled by their smallest row, whatever the edge order, chunking or
task split, checked against a plain union-find; drop lists per shard; a foreign edge refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.dedup import buckets, clusters, keys
from data_juicer_elastic.errors import IntegrityError


def smallest_of_component(rows: int, edges: list[tuple[int, int]]) -> list[int]:
    parent = list(range(rows))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    return [find(x) for x in range(rows)]


def run(rows, edges, tmp_path, chunk):
    left = np.array([a for a, _ in edges], dtype=np.int64)
    right = np.array([b for _, b in edges], dtype=np.int64)

    def chunks():
        for at in range(0, len(left), chunk):
            yield left[at : at + chunk], right[at : at + chunk]

    return clusters.components(rows, chunks, tmp_path)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 60),
    data=st.data(),
    chunk=st.integers(1, 7),
)
def test_components_are_labelled_by_their_smallest_row_whatever_the_order(tmp_path_factory, rows, data, chunk):
    pairs = st.tuples(st.integers(0, rows - 1), st.integers(0, rows - 1))
    edges = data.draw(st.lists(pairs, max_size=3 * rows))
    found = run(rows, edges, tmp_path_factory.mktemp("c"), chunk)
    assert found.labels.tolist() == smallest_of_component(rows, edges)
    shuffled = data.draw(st.permutations(edges))
    assert run(rows, shuffled, tmp_path_factory.mktemp("c"), chunk).labels.tolist() == found.labels.tolist()


@pytest.mark.parametrize("order", ["forward", "backward", "interleaved"])
def test_a_long_chain_converges_in_few_rounds(tmp_path, order):
    rows = 200_000
    edges = [(i + 1, i) for i in range(rows - 1)]
    if order == "backward":
        edges.reverse()
    elif order == "interleaved":
        edges = edges[::2] + edges[1::2]
    found = run(rows, edges, tmp_path, chunk=1 << 14)
    assert not found.labels.any() and found.rounds <= 20
    assert list(tmp_path.iterdir()) == []  # the scratch files are gone


def test_labels_take_four_bytes_a_row_below_two_to_the_32():
    assert clusters.label_dtype(10).itemsize == 4 and clusters.label_dtype(1 << 32).itemsize == 8


def write_edges(path, pairs, identity="id"):
    edges = np.empty(len(pairs), dtype=[(f, "<u8") for f in buckets.FIELDS])
    edges["row"] = [a for a, _ in pairs]
    edges["root"] = [b for _, b in pairs]
    edges.sort()
    buckets.publish_table(
        path, kind=buckets.KIND, identity=identity, fields=buckets.FIELDS, sections=[("edges", edges)]
    )
    return buckets.open_edges(path, identity=identity)


def gid(shard, row):
    return int(keys.global_rows(shard, row + 1)[-1])


def test_drop_lists_name_rows_within_each_shard(tmp_path):
    # shard 0: rows 0..2, shard 1: rows 0..1, shard 2: none, shard 3: rows 0..3
    pairs = [(gid(1, 1), gid(0, 2)), (gid(3, 3), gid(1, 1)), (gid(3, 0), gid(0, 0)), (gid(3, 2), gid(3, 1))]
    readers = [write_edges(tmp_path / "e1", pairs[:2]), write_edges(tmp_path / "e2", pairs[2:])]
    result = clusters.run_cluster(readers, [3, 2, 0, 4], lambda s: tmp_path / f"d{s}", identity="id", scratch=tmp_path)
    assert result.dropped == (0, 1, 0, 3) and result.rows == 9
    got = [clusters.read_drops(tmp_path / f"d{s}", identity="id", shard=s).tolist() for s in range(4)]
    assert got == [[], [1], [], [0, 2, 3]]
    with pytest.raises(IntegrityError, match="shard 1, not 2"):
        clusters.read_drops(tmp_path / "d1", identity="id", shard=2)


def test_star_drops_read_one_shards_slice(tmp_path):
    pairs = [(gid(1, 1), gid(0, 2)), (gid(1, 0), gid(0, 2)), (gid(2, 5), gid(1, 1))]
    readers = [write_edges(tmp_path / "e1", pairs[:1]), write_edges(tmp_path / "e2", pairs[1:])]
    assert clusters.star_drops(readers, 1, 2).tolist() == [0, 1]
    assert clusters.star_drops(readers, 2, 6).tolist() == [5]
    assert clusters.star_drops(readers, 0, 3).tolist() == []
    with pytest.raises(IntegrityError, match="row 5 of shard 2"):
        clusters.star_drops(readers, 2, 3)


def test_an_edge_to_a_row_no_shard_has_is_refused(tmp_path):
    readers = [write_edges(tmp_path / "e", [(gid(5, 0), gid(0, 0))])]
    with pytest.raises(IntegrityError, match="another job"):
        clusters.run_cluster(readers, [1, 1], lambda s: tmp_path / f"d{s}", identity="id", scratch=tmp_path)
    readers = [write_edges(tmp_path / "f", [(gid(1, 3), gid(0, 0))])]
    with pytest.raises(IntegrityError, match="another job"):
        clusters.run_cluster(readers, [1, 1], lambda s: tmp_path / f"d{s}", identity="id", scratch=tmp_path)
