"""The deduplication file format: range reads read only what they need and match a full scan; a
truncated, tampered, foreign or other-kind file is refused before use; publication is first-wins and
replaces a refused file."""

from __future__ import annotations

import os

import numpy as np
import pytest

from data_juicer_elastic.dedup import tables
from data_juicer_elastic.errors import IntegrityError

FIELDS = ("key", "row")


def sorted_entries(values: list[int]) -> np.ndarray:
    entries = np.empty(len(values), dtype=tables.table_dtype(FIELDS))
    entries["key"] = sorted(values)
    entries["row"] = np.arange(len(values))
    return entries


def publish(path, sections, identity="job-a", block_entries=4, kind="test-table"):
    return tables.write_table(
        path, kind=kind, identity=identity, fields=FIELDS, sections=sections, meta={"n": 1}, block_entries=block_entries
    )


@pytest.fixture
def table(tmp_path):
    rng = np.random.default_rng(7)
    values = rng.integers(0, 50, size=37).tolist() + [7] * 9  # a run of equal keys across blocks
    path = tmp_path / "t.tbl"
    assert publish(path, [("a", sorted_entries(values)), ("b", sorted_entries([])), ("c", sorted_entries([3]))])
    return path, sorted(values)


@pytest.mark.parametrize("low,high", [(0, None), (0, 7), (7, 8), (6, 20), (49, None), (50, None), (8, 8), (0, 1)])
def test_a_range_read_returns_exactly_the_keys_in_the_range(table, low, high):
    path, values = table
    reader = tables.TableReader(path, kind="test-table", identity="job-a")
    got = reader.read("a", low, high)["key"].tolist()
    assert got == [v for v in values if v >= low and (high is None or v < high)]
    assert reader.read("b", low, high).size == 0
    assert reader.meta == {"n": 1}


def test_a_range_read_reads_only_the_blocks_that_can_hold_it(table, monkeypatch):
    path, values = table
    reader = tables.TableReader(path, kind="test-table", identity="job-a")
    asked = []
    original = reader._blocks
    monkeypatch.setattr(reader, "_blocks", lambda s, a, b: asked.append((a, b)) or original(s, a, b))
    reader.read("a", 40, None)
    (first, last), blocks = asked[0], len(reader.section("a").firsts)
    needed = sum(v >= 40 for v in values)
    assert last == blocks and first > 0 and last - first <= needed // 4 + 2


def test_the_whole_section_streams_in_checked_blocks(table):
    path, values = table
    reader = tables.TableReader(path, kind="test-table", identity="job-a")
    assert np.concatenate(list(reader.iter_blocks("a", blocks_per_read=2)))["key"].tolist() == values


def test_an_unsorted_section_is_not_written(tmp_path):
    entries = sorted_entries([1, 2, 3])[::-1]
    with pytest.raises(ValueError, match="not sorted"):
        publish(tmp_path / "t.tbl", [("a", entries)])
    assert os.listdir(tmp_path) == []


def refused(path, match, **kwargs):
    with pytest.raises(IntegrityError, match=match) as caught:
        reader = tables.TableReader(
            path, kind=kwargs.get("kind", "test-table"), identity=kwargs.get("identity", "job-a")
        )
        reader.read("a")
    assert str(path) in str(caught.value)


def test_a_truncated_file_is_refused(table):
    path, _ = table
    os.truncate(path, path.stat().st_size - 1)
    refused(path, "truncated")
    os.truncate(path, 10)
    refused(path, "truncated")


def test_bytes_appended_are_refused(table):
    path, _ = table
    with open(path, "ab") as handle:
        handle.write(b"\0" * 16)
    refused(path, "appended")


def test_a_tampered_block_is_refused_when_read(table):
    path, _ = table
    data = bytearray(path.read_bytes())
    data[-20] ^= 1  # inside the last entries
    path.write_bytes(bytes(data))
    reader = tables.TableReader(path, kind="test-table", identity="job-a")
    with pytest.raises(IntegrityError, match="sha256"):
        reader.read("a")
    assert reader.read("c")["key"].tolist() == [3]  # another section's blocks are still good


def test_a_tampered_header_is_refused(table):
    path, _ = table
    data = bytearray(path.read_bytes())
    data[data.index(b'"n":1') + 4] = ord("2")
    path.write_bytes(bytes(data))
    refused(path, "header checksum")


def test_a_tampered_section_index_is_refused_when_the_section_is_used(table):
    path, _ = table
    data = bytearray(path.read_bytes())
    data[data.index(b'"firsts": [3]') + 11] = ord("4")  # section c's index
    path.write_bytes(bytes(data))
    reader = tables.TableReader(path, kind="test-table", identity="job-a")
    assert len(reader.read("a")) == 46  # another section's index is still good
    with pytest.raises(IntegrityError, match="index of section c"):
        reader.read("c")


def test_a_reader_reads_only_the_index_of_the_sections_it_uses(table):
    path, _ = table
    reader = tables.TableReader(path, kind="test-table", identity="job-a")
    reader.read("b")
    assert set(reader._sections) == {"b"} and reader.section_names == ["a", "b", "c"]


def test_a_file_of_another_identity_or_kind_is_refused(table, tmp_path):
    path, _ = table
    refused(path, "different recipe", identity="job-b")
    refused(path, "not 'edges'", kind="edges")
    other = tmp_path / "other"
    other.write_bytes(b"hello world, not a table at all")
    refused(other, "not a dj-elastic")


def test_publication_is_first_wins_and_a_refused_file_is_replaced(tmp_path):
    path = tmp_path / "t.tbl"
    first = sorted_entries([1, 2, 3])
    table = dict(kind="test-table", identity="job-a", fields=FIELDS, sections=[("a", first)])
    assert tables.publish_table(path, **table).read("a")["key"].tolist() == [1, 2, 3]
    assert tables.write_table(path, **table)  # the same bytes again: there
    assert not tables.write_table(path, **{**table, "sections": [("a", sorted_entries([4]))]})
    os.truncate(path, path.stat().st_size - 8)
    assert tables.publish_table(path, **table).read("a")["key"].tolist() == [1, 2, 3]
    assert [name for name in os.listdir(tmp_path)] == ["t.tbl"]  # no temp file left


@pytest.mark.parametrize("head_read", [1, 40, 1 << 20])
def test_the_first_read_may_hold_the_header_and_indexes_or_not(table, monkeypatch, head_read):
    path, values = table
    monkeypatch.setattr(tables, "HEAD_READ", head_read)
    reader = tables.TableReader(path, kind="test-table", identity="job-a")
    assert reader.read("a", 7, 8)["key"].tolist() == [v for v in values if v == 7]
    assert reader.read("c")["key"].tolist() == [3]
