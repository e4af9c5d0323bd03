"""A .jsonl.zst input, zstd-compressed shards and the streaming merge through the real `dj-process`:
Data-Juicer's Ray reader reads the compressed shards, and the streamed output equals a plain merge."""

from __future__ import annotations

import json

import pytest
import zstandard

from .conftest import assert_ok, elastic_recipe, read_jsonl, run

pytestmark = [pytest.mark.e2e, pytest.mark.ray]


def test_compressed_input_and_shards_with_streaming_merge(tmp_path, demo_input):
    data = tmp_path / "input.jsonl.zst"
    data.write_bytes(zstandard.ZstdCompressor().compress(demo_input.read_bytes()))
    recipe = elastic_recipe(tmp_path, data, num_shards=2, shard_codec="zstd", stream_merge=True, poll_interval_secs=0.5)
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
    assert 0 < len(rows) < 600 and [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    plain = tmp_path / "plain.jsonl"
    assert_ok(run(["dj-elastic", "merge", "--job-dir", str(job), "--output", str(plain)], cwd=tmp_path))
    assert plain.read_bytes() == merged.read_bytes()
