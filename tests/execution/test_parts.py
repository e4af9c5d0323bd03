"""Ray part files -> canonical JSONL, without Ray."""

from __future__ import annotations

import hashlib
import json

import pytest

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.execution._parts import list_parts, write_canonical

DS, WRITE = "0355xXv4lzjLpENmsSRs1L", "9dba27fdd04347d98a25b483bac5cb15"


def part(directory, task: int, rows: list[dict], *, ds=DS, write=WRITE):
    path = directory / f"{ds}_{write}_{task:06d}.json"
    # what pandas' to_json(force_ascii=False) writes: compact, "/" escaped
    path.write_text("".join(json.dumps(r, ensure_ascii=False).replace("/", "\\/") + "\n" for r in rows))
    return path


def test_parts_are_ordered_by_task_index_with_gaps(tmp_path):
    out = tmp_path / "ray-output"
    out.mkdir()
    p10 = part(out, 10, [{"i": 3}])
    p2 = part(out, 2, [{"i": 1}, {"i": 2}])
    p0 = part(out, 0, [{"i": 0}])
    assert list_parts(out) == [p0, p2, p10]


def test_canonical_rows_are_compact_unescaped_and_in_part_order(tmp_path):
    out = tmp_path / "ray-output"
    out.mkdir()
    part(out, 1, [{"text": "b/ü 测试", "n": 1.5, "s": {"x": None}}])
    part(out, 0, [{"text": "a", "n": 1}])
    result = write_canonical(list_parts(out), tmp_path / "output.jsonl")
    data = (tmp_path / "output.jsonl").read_bytes()
    assert data == b'{"text":"a","n":1}\n' + '{"text":"b/ü 测试","n":1.5,"s":{"x":null}}\n'.encode()
    assert (result.rows, result.bytes, result.sha256) == (2, len(data), hashlib.sha256(data).hexdigest())


def test_order_key_merges_parts_by_row_index(tmp_path):
    out = tmp_path / "ray-output"
    out.mkdir()
    part(out, 0, [{"idx": 4}, {"idx": 6}])  # the first-named part holds later rows
    part(out, 1, [{"idx": 0}, {"idx": 1}, {"idx": 5}])
    part(out, 2, [{"idx": 2}, {"idx": 2, "split": True}])
    write_canonical(list_parts(out), tmp_path / "o.jsonl", order_key="idx")
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert rows == [{"idx": 0}, {"idx": 1}, {"idx": 2}, {"idx": 2, "split": True}, {"idx": 4}, {"idx": 5}, {"idx": 6}]


def test_order_key_missing_is_an_error(tmp_path):
    out = tmp_path / "ray-output"
    out.mkdir()
    part(out, 0, [{"text": "no index"}])
    with pytest.raises(ElasticError, match="row-order field 'idx'"):
        write_canonical(list_parts(out), tmp_path / "o.jsonl", order_key="idx")
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("kind", ["empty-file", "empty-dir"])
def test_nothing_written_means_zero_rows(tmp_path, kind):
    out = tmp_path / "ray-output"
    if kind == "empty-file":
        out.write_bytes(b"")
    else:
        out.mkdir()
    assert list_parts(out) == []
    result = write_canonical([], tmp_path / "output.jsonl")
    assert result.rows == 0 and (tmp_path / "output.jsonl").read_bytes() == b""


def test_two_writes_in_one_directory_are_refused(tmp_path):
    out = tmp_path / "ray-output"
    out.mkdir()
    part(out, 0, [{"i": 0}])
    part(out, 0, [{"i": 0}], write="0" * 32)
    with pytest.raises(ElasticError, match="2 different Ray writes"):
        list_parts(out)


def test_foreign_entries_and_missing_export_are_refused(tmp_path):
    out = tmp_path / "ray-output"
    with pytest.raises(ElasticError, match="wrote nothing"):
        list_parts(out)
    out.mkdir()
    (out / "notes.txt").write_text("x")
    with pytest.raises(ElasticError, match="unexpected entry"):
        list_parts(out)
    (out / "notes.txt").unlink()
    (out / ".part.crc").write_text("hidden temporaries are ignored")
    assert list_parts(out) == []


def test_non_empty_plain_file_is_refused(tmp_path):
    out = tmp_path / "ray-output"
    out.write_text('{"a":1}\n')
    with pytest.raises(ElasticError, match="non-empty file"):
        list_parts(out)
