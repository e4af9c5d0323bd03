"""Prepare's single read: block splitter == reference splitter, the one-pass and two-pass paths give
identical shards, .jsonl.gz/.jsonl.zst inputs, shard codecs through a worker and merge."""

from __future__ import annotations

import gzip
import hashlib
import json

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import ConfigError, InputError
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.tasks import ShardOutput
from data_juicer_elastic.jobdir.worker_loop import run_worker
from data_juicer_elastic.rows.codecs import ShardFileWriter
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.shards.splitter import BlockSplitter, ShardSplitter

from .conftest import identity, make_rows, request, write_rows


class _MemoryPiece:
    def __init__(self):
        self.data = bytearray()
        self.rows = 0

    def write(self, data, rows):
        self.data += data
        self.rows += rows

    def finish(self):
        return hashlib.sha256(self.data).hexdigest(), len(self.data), hashlib.sha256(self.data).hexdigest()

    def abort(self):
        pass


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=50),
    cuts=st.lists(st.integers(1, 40), max_size=8),
    with_cap=st.booleans(),
    data=st.data(),
)
def test_block_splitter_cuts_exactly_where_the_reference_does(tmp_path_factory, sizes, cuts, with_cap, data):
    n = data.draw(st.integers(1, len(sizes)))
    rows = [(b"%d:" % i).ljust(size - 1, b"x")[: size - 1] + b"\n" for i, size in enumerate(sizes)]
    out = tmp_path_factory.mktemp("ref")
    reference = ShardSplitter(out, n, len(rows), sum(sizes))
    for row in rows:
        reference.add(row)
    expected = [(e.first_row, e.rows, e.bytes, e.sha256) for e in reference.finish()]

    pieces: list[_MemoryPiece] = []

    def open_piece(k):
        pieces.append(_MemoryPiece())
        return pieces[-1]

    # Feed the same rows in arbitrary whole-row blocks, sometimes as a slice of a larger buffer.
    splitter = BlockSplitter(n, sum(sizes), len(rows) if with_cap else None, open_piece)
    i = 0
    for cut in [*cuts, len(rows)]:
        block_rows = rows[i : i + cut]
        i += len(block_rows)
        if block_rows:
            block = b"junk\n" + b"".join(block_rows) + b"tail"
            splitter.add(block, 5, len(block) - 4, rows=len(block_rows) if cut % 2 else None)
    got = [(p.first_row, p.rows, p.bytes, p.sha256) for p in splitter.finish()]
    if with_cap or splitter.cap_respected(len(rows)):
        assert got == expected
    assert b"".join(p.data for p in pieces) == b"".join(rows)


def _shards(job, manifest):
    from data_juicer_elastic.rows.codecs import SHARD_SUFFIX

    return [
        (job / "shards" / f"{s.shard_id}{SHARD_SUFFIX[manifest.shard_codec]}").read_bytes() for s in manifest.shards
    ]


def _rows(n, start=0):
    return [{"id": i, "text": f"row {i} " + "x" * (i * 7 % 90)} for i in range(start, start + n)]


def test_one_pass_and_two_pass_paths_give_identical_shards(tmp_path):
    clean = write_rows(tmp_path / "clean.jsonl", _rows(500))
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(clean.read_bytes().replace(b"\n", b"\r\n"))
    zst = tmp_path / "in.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(clean.read_bytes()))
    gz = tmp_path / "in.jsonl.gz"
    gz.write_bytes(gzip.compress(clean.read_bytes()[:9000]) + gzip.compress(clean.read_bytes()[9000:]))  # 2 members

    outcomes = {p.name: prepare_job(request(tmp_path / f"job-{p.name}", p, 7)).manifest for p in (clean, crlf, zst, gz)}
    reference = outcomes["clean.jsonl"]
    for name, manifest in outcomes.items():
        assert manifest.shards == reference.shards, name
        assert manifest.content_sha256 == reference.content_sha256 == hashlib.sha256(clean.read_bytes()).hexdigest()
        assert _shards(tmp_path / f"job-{name}", manifest) == _shards(tmp_path / "job-clean.jsonl", reference)
    # Fingerprints describe the files as stored.
    assert outcomes["in.jsonl.zst"].inputs[0].sha256 == hashlib.sha256(zst.read_bytes()).hexdigest()
    assert outcomes["in.jsonl.gz"].inputs[0].size == gz.stat().st_size


def test_directory_of_mixed_codecs_keeps_relpath_order_and_global_index(tmp_path):
    root = tmp_path / "ds"
    write_rows(root / "a.jsonl", [{"src": "a"}])
    (root / "b.jsonl.gz").write_bytes(gzip.compress(b'{"src": "b"}\n{"src": "b", "idx": 7}\n'))
    (root / "c").mkdir()
    (root / "c" / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b'{"src": "d"}\n'))
    (root / "notes.json.gz").write_bytes(gzip.compress(b"ignored"))
    manifest = prepare_job(request(tmp_path / "job", root, 2, index_key="idx")).manifest
    assert [f.relpath for f in manifest.inputs] == ["a.jsonl", "b.jsonl.gz", "c/d.jsonl.zst"]
    rows = [json.loads(line) for shard in _shards(tmp_path / "job", manifest) for line in shard.splitlines()]
    assert [(r["src"], r["idx"]) for r in rows] == [("a", 0), ("b", 1), ("b", 7), ("d", 3)]


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_corrupt_or_truncated_compressed_input_names_the_file(tmp_path, codec):
    body = b"".join(json.dumps(r).encode() + b"\n" for r in _rows(300))
    packed = gzip.compress(body) if codec == "gzip" else zstandard.ZstdCompressor().compress(body)
    data = tmp_path / ("in.jsonl.gz" if codec == "gzip" else "in.jsonl.zst")
    data.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(InputError, match=f"corrupt {codec} data") as info:
        prepare_job(request(tmp_path / "job", data, 2))
    assert info.value.where == str(data)
    assert not (tmp_path / "job" / "manifest.json").exists()


def test_errors_in_compressed_input_give_the_decompressed_line(tmp_path):
    data = tmp_path / "in.jsonl.zst"
    data.write_bytes(zstandard.ZstdCompressor().compress(b'{"a": 1}\n{"a": 2}\n{"a": NaN}\n'))
    with pytest.raises(InputError, match="NaN") as info:
        prepare_job(request(tmp_path / "job", data, 1))
    assert info.value.where == f"{data}:3"


def _unzstd(raw: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompressobj().decompress(raw)  # shards carry no content size


def _decompressing_runner(task):
    raw = task.shard_path.read_bytes()
    text = gzip.decompress(raw) if task.shard_path.suffix == ".gz" else _unzstd(raw)
    out = task.attempt_dir / "output.jsonl"
    out.write_bytes(text)
    return ShardOutput(out, text.count(b"\n"))


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_shard_codec_is_deterministic_and_runs_through_worker_and_merge(tmp_path, codec):
    data = write_rows(tmp_path / "in.jsonl", make_rows(60))
    plain = prepare_job(request(tmp_path / "plain", data, 3)).manifest
    packed = prepare_job(request(tmp_path / "packed", data, 3, shard_codec=codec)).manifest
    again = prepare_job(request(tmp_path / "again", data, 3, shard_codec=codec)).manifest
    assert packed.shard_codec == codec and load_manifest(tmp_path / "packed").shard_codec == codec
    assert [(s.rows, s.bytes, s.sha256) for s in packed.shards] == [(s.rows, s.bytes, s.sha256) for s in plain.shards]
    assert packed.shards == again.shards, "compressed shards are byte-identical from run to run"
    suffix = ".jsonl.gz" if codec == "gzip" else ".jsonl.zst"
    files = sorted((tmp_path / "packed" / "shards").iterdir())
    assert [f.name for f in files] == [f"{s.shard_id}{suffix}" for s in packed.shards]
    for entry, file in zip(packed.shards, files, strict=True):
        assert (entry.stored_bytes, entry.stored_sha256) == (
            file.stat().st_size,
            hashlib.sha256(file.read_bytes()).hexdigest(),
        )

    summary = run_worker(
        tmp_path / "packed",
        identity(),
        _decompressing_runner,
        ttl_secs=60.0,
        heartbeat_secs=10.0,
        max_retries=0,
        poll_interval_secs=0.5,
    )
    assert summary.complete
    merged = merge_job(tmp_path / "packed", tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_bytes() == data.read_bytes() and merged.rows == 60
    with pytest.raises(ConfigError, match="unknown shard codec"):
        prepare_job(request(tmp_path / "bad", data, 3, shard_codec="lz4"))


def test_a_modified_compressed_shard_is_refused_before_running(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(20))
    job = tmp_path / "job"
    prepare_job(request(job, data, 2, shard_codec="zstd"))
    shard = job / "shards" / "part-00001-of-00002.jsonl.zst"
    shard.write_bytes(zstandard.ZstdCompressor(level=19).compress(_unzstd(shard.read_bytes())))
    summary = run_worker(
        job,
        identity(),
        _decompressing_runner,
        ttl_secs=60.0,
        heartbeat_secs=10.0,
        max_retries=0,
        poll_interval_secs=0.5,
    )
    assert summary.terminal_failures and summary.terminal_failures[0][0] == "part-00001-of-00002"
    assert "input shard is corrupt" in summary.terminal_failures[0][1]


def test_shard_file_writer_hashes_content_and_stored_bytes(tmp_path):
    writer = ShardFileWriter(tmp_path / "s.jsonl.zst", "zstd")
    writer.write(b'{"a":1}\n', 1)
    writer.write(memoryview(b'{"a":2}\n'), 1)
    content, stored_bytes, stored_sha = writer.finish()
    raw = (tmp_path / "s.jsonl.zst").read_bytes()
    assert content == hashlib.sha256(b'{"a":1}\n{"a":2}\n').hexdigest()
    assert (stored_bytes, stored_sha) == (len(raw), hashlib.sha256(raw).hexdigest())
    assert zstandard.ZstdDecompressor().decompressobj().decompress(raw) == b'{"a":1}\n{"a":2}\n'


def test_settings_type_and_validate_the_new_keys():
    from data_juicer_elastic.settings import ElasticSettings

    settings = ElasticSettings(job_dir="/j", shard_codec="zstd", stream_merge=True, max_line_bytes=1 << 20)
    assert (settings.shard_codec, settings.stream_merge, settings.max_line_bytes) == ("zstd", True, 1 << 20)
    for key, bad in (("shard_codec", "lz4"), ("stream_merge", "yes"), ("max_line_bytes", 10)):
        with pytest.raises(ConfigError) as info:
            ElasticSettings(job_dir="/j", **{key: bad})
        assert info.value.where == f"elastic.{key}"


def test_clean_input_is_sharded_in_one_pass_even_with_media_keys(tmp_path):
    from data_juicer_elastic.rows.codecs import input_codec
    from data_juicer_elastic.rows.jsonl import NormaliseOptions
    from data_juicer_elastic.shards.ingest import InputItem, ingest

    rows = [{"id": i, "images": [f"/abs/{i}.jpg"], "text": "t:" * (i % 5)} for i in range(300)]
    clean = write_rows(tmp_path / "clean.jsonl", rows)
    relative = write_rows(tmp_path / "rel.jsonl", [{**r, "images": [f"{r['id']}.jpg"]} for r in rows])
    options = NormaliseOptions(str(tmp_path), {"image_key": "images"}, None)

    def run(path, name):
        out = tmp_path / name / "shards"
        out.mkdir(parents=True)
        item = InputItem(path, path.name, input_codec(path.name))
        return ingest([item], options, tmp_path / name, out, 4, "none"), out

    one, out = run(clean, "one")
    assert one.passes == 1 and one.content_sha256 == hashlib.sha256(clean.read_bytes()).hexdigest()
    assert b"".join(p.read_bytes() for p in sorted(out.iterdir())) == clean.read_bytes()
    two, out = run(relative, "two")
    assert two.passes == 2, "relative paths grow the rows: the guessed total is wrong, so pass B cuts"
    got = [json.loads(line) for p in sorted(out.iterdir()) for line in p.read_bytes().splitlines()]
    assert [r["images"] for r in got] == [[str(tmp_path / f"{i}.jpg")] for i in range(300)]


def test_compressed_inputs_with_a_size_in_their_headers_are_sharded_in_one_pass(tmp_path):
    """zstd frame headers and gzip trailers tell the decoded size: then pass A cuts the final
    shards.  A hint that is short (several zstd frames) or wrong (several gzip members: the
    trailer counts the last one) costs pass B, and the shards come out the same."""
    from data_juicer_elastic.rows.codecs import decoded_size_hint, input_codec
    from data_juicer_elastic.rows.jsonl import NormaliseOptions
    from data_juicer_elastic.shards.ingest import InputItem, ingest

    clean = write_rows(tmp_path / "in.jsonl", [{"id": i, "text": "x" * (i % 50)} for i in range(2_000)])
    raw = clean.read_bytes()
    half = raw.index(b"\n", len(raw) // 2) + 1
    files = {
        "one.jsonl.zst": (zstandard.ZstdCompressor().compress(raw), 1),
        "one.jsonl.gz": (gzip.compress(raw), 1),
        "streamed.jsonl.zst": (zstandard.ZstdCompressor(write_content_size=False).compress(raw), 2),
        "frames.jsonl.zst": (
            zstandard.ZstdCompressor().compress(raw[:half]) + zstandard.ZstdCompressor().compress(raw[half:]),
            2,
        ),
        "members.jsonl.gz": (gzip.compress(raw[:half]) + gzip.compress(raw[half:]), 2),
    }
    options = NormaliseOptions(str(tmp_path), {}, None)
    plain_out = tmp_path / "plain" / "shards"
    plain_out.mkdir(parents=True)
    plain = ingest([InputItem(clean, clean.name, "none")], options, tmp_path / "plain", plain_out, 4, "none")
    assert decoded_size_hint(clean, "none") == len(raw)
    for name, (data, passes) in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        hint = decoded_size_hint(path, input_codec(name))
        assert (hint == len(raw)) is (passes == 1), name
        out = tmp_path / name.replace(".", "-") / "shards"
        out.mkdir(parents=True)
        got = ingest([InputItem(path, name, input_codec(name))], options, out.parent, out, 4, "none")
        assert got.passes == passes, name
        assert [(s.rows, s.sha256) for s in got.shards] == [(s.rows, s.sha256) for s in plain.shards], name
        assert got.content_sha256 == plain.content_sha256 == hashlib.sha256(raw).hexdigest()
        assert [p.read_bytes() for p in sorted(out.iterdir())] == [p.read_bytes() for p in sorted(plain_out.iterdir())]
