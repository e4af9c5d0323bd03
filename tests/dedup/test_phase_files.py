"""The phases' files across reruns and faults: a rerun finds its own files (same bytes); a tampered,
truncated or foreign signature, edge or drop file is refused where it is read, naming it, and the
phase that wrote it replaces it when it runs again; the kept rows are then the same."""

from __future__ import annotations

import os

import numpy as np
import pytest

from data_juicer_elastic.dedup import buckets, clusters, signatures
from data_juicer_elastic.errors import IntegrityError
from tests.dedup.pipeline import IDENTITY, kept_rows

KEYS = np.random.default_rng(5).integers(0, 4, (30, 3, 2)).astype(np.uint64)


def flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def job(tmp_path):
    kept = kept_rows(tmp_path, KEYS, 4, "minhash")
    return tmp_path, kept


def test_a_rerun_finds_every_file_it_published_and_keeps_the_same_rows(job):
    root, kept = job
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert kept_rows(root, KEYS, 4, "minhash") == kept
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("folder", ["sig", "edges", "drops"])
@pytest.mark.parametrize("damage", ["tamper", "truncate"])
def test_a_damaged_phase_file_is_refused_then_replaced_by_its_phase(job, folder, damage):
    root, kept = job
    victim = sorted((root / folder).iterdir())[-1]
    if damage == "tamper":
        flip_last_byte(victim)
    else:
        os.truncate(victim, victim.stat().st_size - 1)
    with pytest.raises(IntegrityError) as refused:
        if folder == "sig":
            reader = signatures.open_signatures(victim, identity=IDENTITY)
            [reader.read(name) for name in reader.section_names]
        elif folder == "edges":
            list(buckets.open_edges(victim, identity=IDENTITY).iter_blocks(buckets.SECTION))
        else:
            clusters.read_drops(victim, identity=IDENTITY, shard=int(victim.stem))
    assert str(victim) in str(refused.value)
    assert kept_rows(root, KEYS, 4, "minhash") == kept  # each phase republishes its refused file
    if folder == "sig":
        signatures.open_signatures(victim, identity=IDENTITY).read(signatures.band_name(0))


def test_files_left_by_another_recipe_are_refused_and_replaced(job):
    root, kept = job
    other = kept_rows(root / "other", KEYS[::-1].copy(), 4, "minhash", identity="recipe-b/stage-1")
    for folder in ("sig", "edges", "drops"):
        for path in (root / "other" / folder).iterdir():
            os.replace(path, root / folder / path.name)  # the other recipe's files where ours were
    with pytest.raises(IntegrityError, match="different recipe"):
        signatures.open_signatures(root / "sig" / "00000.sig", identity=IDENTITY)
    assert kept_rows(root, KEYS, 4, "minhash") == kept
    assert other == kept_rows(root / "other2", KEYS[::-1].copy(), 4, "minhash")


def test_a_shard_the_stage_left_empty_has_no_bands_and_is_skipped(tmp_path):
    keys = np.random.default_rng(2).integers(0, 3, (6, 2, 2)).astype(np.uint64)
    readers = []
    for shard, part in enumerate([keys[:3], np.empty((0, 0, 2), np.uint64), keys[3:]]):
        path = tmp_path / f"{shard}.sig"
        signatures.publish_signatures(
            path, identity=IDENTITY, shard=shard, keys=part, rows=np.arange(len(part)), input_rows=len(part) or 2,
            method="minhash",
        )  # fmt: skip
        readers.append(signatures.open_signatures(path, identity=IDENTITY))
    tasks = buckets.bucket_tasks(readers, 2)
    assert {task.band for task in tasks} == {0, 1}
    edge_readers = []
    for number, task in enumerate(tasks):
        buckets.run_bucket(task, readers, tmp_path / f"{number}.edges", identity=IDENTITY, method="minhash")
        edge_readers.append(buckets.open_edges(tmp_path / f"{number}.edges", identity=IDENTITY))
    result = clusters.run_cluster(
        edge_readers, [3, 2, 3], lambda shard: tmp_path / f"{shard}.drops", identity=IDENTITY, scratch=tmp_path
    )
    drops = [clusters.read_drops(tmp_path / f"{s}.drops", identity=IDENTITY, shard=s).tolist() for s in (0, 1, 2)]
    kept = [r for r in range(3) if r not in drops[0]] + [3 + r for r in range(3) if r not in drops[2]]
    assert kept == kept_rows(tmp_path / "whole", keys, 1, "minhash") and result.dropped[1] == 0


@pytest.mark.parametrize("num_shards", [1, 2, 7, 40])
def test_rows_that_never_reach_the_stage_keep_their_input_row_numbers(tmp_path, num_shards):
    """The rows reaching a deduplicator are a subsequence of each shard's input rows: the signature
    files carry their input row numbers, the drop lists name input rows, and the stage keeps what it
    keeps of the same rows laid end to end."""
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 4, (40, 3, 2)).astype(np.uint64)
    reached = rng.random(40) < 0.6
    kept = kept_rows(tmp_path / "gaps", keys, num_shards, "minhash", reached=reached)
    survivors = np.flatnonzero(reached)
    assert kept == survivors[kept_rows(tmp_path / "dense", keys[reached], 1, "minhash")].tolist()
    exact = kept_rows(tmp_path / "exact", keys[:, :1], num_shards, "exact", reached=reached)
    assert exact == survivors[kept_rows(tmp_path / "dense-exact", keys[reached][:, :1], 1, "exact")].tolist()
