"""A .jsonl.zst input, zstd-compressed shards and the streaming merge through the real `dj-process`:
the shard reader reads the compressed shards, and the streamed output equals a plain merge.  One
row is a 30 MB line: Ray's JSON reader failed on it ("straddling object straddles two block
boundaries") after prepare had accepted it; it must come out exactly as it went in."""

from __future__ import annotations

import json

import pytest
import zstandard

from .conftest import assert_ok, elastic_recipe, read_jsonl, run

pytestmark = [pytest.mark.e2e, pytest.mark.ray]


@pytest.mark.extended
def test_compressed_input_and_shards_with_streaming_merge(tmp_path, demo_input):
    data = tmp_path / "input.jsonl.zst"
    long_row = {"id": 600, "text": "long " * 6_000_000, "meta": {"source": "x" * 100}}  # a 30 MB line
    raw = demo_input.read_bytes() + json.dumps(long_row).encode() + b"\n"
    data.write_bytes(zstandard.ZstdCompressor().compress(raw))
    process = [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 10, "max_len": 10**8}}]
    recipe = elastic_recipe(
        tmp_path, data, process=process, num_shards=2, shard_codec="zstd", stream_merge=True, poll_interval_secs=0.5
    )
    assert_ok(run(["dj-process", "--config", str(recipe)], cwd=tmp_path))

    job = tmp_path / "job" / "job"
    merged = tmp_path / "job" / "merged.jsonl"
    assert sorted(p.name for p in (job / "shards").iterdir()) == [
        "part-00000-of-00002.jsonl.zst",
        "part-00001-of-00002.jsonl.zst",
    ]
    progress = json.loads((tmp_path / "job" / "merged.jsonl.progress.json").read_text())
    assert progress["complete"] and progress["shards_final"] == 2 and progress["bytes_final"] == merged.stat().st_size
    assert not (tmp_path / "job" / "merged.jsonl.partial").exists()

    rows = read_jsonl(merged)
    assert 0 < len(rows) < 601 and [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    assert rows[-1]["id"] == 600 and rows[-1]["text"] == long_row["text"].strip(), "the long row, normalised"
    assert rows[-1]["meta"] == long_row["meta"]
    plain = tmp_path / "plain.jsonl"
    assert_ok(run(["dj-elastic", "merge", "--job-dir", str(job), "--output", str(plain)], cwd=tmp_path))
    assert plain.read_bytes() == merged.read_bytes()
