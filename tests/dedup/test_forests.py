"""Edge files merged into star forests: the cluster step finds the same drops from the merged files as
from the originals, whatever the merge tree, and a repeated edge is read once."""

from __future__ import annotations

import numpy as np
import pytest

from data_juicer_elastic.dedup import buckets, clusters, forests, keys
from data_juicer_elastic.errors import IntegrityError

ID = "recipe-a/stage-1"
SIZES = [40, 0, 25, 35]


def write(path, row, root):
    edges = np.empty(len(row), dtype=[(f, "<u8") for f in buckets.FIELDS])
    edges["row"], edges["root"] = row, root
    buckets.publish_table(
        path, kind=buckets.KIND, identity=ID, fields=buckets.FIELDS, sections=[("edges", buckets.unique_edges(edges))]
    )
    return buckets.open_edges(path, identity=ID)


def to_ids(dense):
    offsets = np.r_[0, np.cumsum(SIZES)]
    shard = np.searchsorted(offsets, dense, "right") - 1
    return (shard.astype(np.uint64) << np.uint64(keys.ROW_BITS)) + (dense - offsets[shard]).astype(np.uint64)


def drops(readers, tmp_path, name):
    (tmp_path / name).mkdir()
    result = clusters.run_cluster(readers, SIZES, lambda s: tmp_path / name / f"{s}", identity=ID, scratch=tmp_path)
    return result.dropped, [
        clusters.read_drops(tmp_path / name / f"{s}", identity=ID, shard=s).tolist() for s in range(4)
    ]


@pytest.mark.parametrize("seed", range(4))
def test_a_merge_tree_leaves_the_cluster_step_the_same_drops(tmp_path, seed):
    rng = np.random.default_rng(seed)
    total = sum(SIZES)
    files = []
    for number in range(6):
        row = rng.integers(1, total, 30)
        root = (rng.random(30) * row).astype(np.int64)
        files.append(write(tmp_path / f"e{number}", to_ids(row), to_ids(root)))
    direct = drops(files, tmp_path, "direct")
    level1 = [
        forests.merge_edges(files[i : i + 2], tmp_path / f"m{i}", identity=ID, scratch=tmp_path) for i in (0, 2, 4)
    ]
    merged1 = [buckets.open_edges(m.path, identity=ID) for m in level1]
    assert drops(merged1, tmp_path, "level1") == direct
    top = forests.merge_edges(merged1, tmp_path / "top", identity=ID, scratch=tmp_path)
    assert drops([buckets.open_edges(top.path, identity=ID)], tmp_path, "from-top") == direct
    assert top.edges_out == sum(direct[0])  # one edge per dropped row


def test_an_edge_repeated_in_every_band_is_read_once_after_a_merge(tmp_path):
    same = [write(tmp_path / f"band{b}", to_ids(np.array([5, 9])), to_ids(np.array([1, 5]))) for b in range(25)]
    merged = forests.merge_edges(same, tmp_path / "m", identity=ID, scratch=tmp_path)
    assert (merged.edges_in, merged.edges_out) == (50, 2)
    forest = next(buckets.open_edges(merged.path, identity=ID).iter_blocks("edges"))
    assert [(int(a), int(b)) for a, b in forest.tolist()] == [
        (int(to_ids(np.array([5]))[0]), 1),
        (int(to_ids(np.array([9]))[0]), 1),
    ]


def test_a_merge_output_of_other_inputs_is_refused(tmp_path):
    a = write(tmp_path / "a", to_ids(np.array([3])), to_ids(np.array([1])))
    b = write(tmp_path / "b", to_ids(np.array([4])), to_ids(np.array([2])))
    forests.merge_edges([a], tmp_path / "m", identity=ID, scratch=tmp_path)
    with pytest.raises(IntegrityError, match="two merges"):
        forests.merge_edges([b], tmp_path / "m", identity=ID, scratch=tmp_path)
