from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import ConfigError, InputChangedError, InputError, JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest, load_recipe
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.shards.splitter import ShardSplitter
from data_juicer_elastic.sharedfs import fault_seam

from .conftest import make_rows, request, write_rows

GOOD = b'{"id": 0, "text": "hello"}\n'

BAD_INPUTS = {
    "blank_line": (GOOD + b"\n" + GOOD, 2, "blank line"),
    "whitespace_line": (GOOD + b"   \t\n" + GOOD, 2, "blank line"),
    "array_row": (GOOD + b"[1, 2]\n", 2, "JSON object"),
    "scalar_row": (GOOD + GOOD + b"42\n", 3, "JSON object"),
    "string_row": (b'"just text"\n', 1, "JSON object"),
    "malformed_json": (GOOD + b'{"id": 1, "text": \n', 2, "invalid JSON"),
    "invalid_utf8": (GOOD + b'{"id": 1, "text": "\xff\xfe"}\n', 2, "UTF-8"),
    "lone_surrogate": (GOOD + b'{"id": 1, "text": "\\ud800"}\n', 2, "surrogate"),
    "nan": (b'{"id": 1, "score": NaN}\n', 1, "NaN"),
    "infinity": (GOOD + b'{"id": 1, "score": -Infinity}\n', 2, "Infinity"),
    "overflow": (GOOD + b'{"id": 1, "score": 1e400}\n', 2, "overflows"),
    "duplicate_keys": (GOOD + b'{"id": 1, "id": 2}\n', 2, "duplicate key 'id'"),
    "deep_nesting": (GOOD + b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", 2, "nested too deeply"),
    "bom_not_at_start": (GOOD + b'\xef\xbb\xbf{"id": 1}\n', 2, "invalid JSON"),
    "nul_byte": (GOOD + b'{"id": 1, "text": "a\x00b"}\n', 2, "invalid JSON"),
    "media_not_a_list": (b'{"id": 1, "images": "a.jpg"}\n', 1, "'images' must be a list of strings or null"),
    "media_list_of_ints": (b'{"id": 1, "videos": ["a.mp4", 3]}\n', 1, "'videos' must be a list"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_refused_with_file_and_line(tmp_path, case):
    content, line, message = BAD_INPUTS[case]
    data = tmp_path / "bad.jsonl"
    data.write_bytes(content)
    with pytest.raises(InputError) as info:
        prepare_job(request(tmp_path / "job", data, 1))
    assert info.value.where == f"{data}:{line}"
    assert message in info.value.message
    assert not (tmp_path / "job" / "manifest.json").exists()


def test_huge_line_is_refused_without_reading_it_whole(tmp_path):
    data = tmp_path / "huge.jsonl"
    data.write_bytes(GOOD + b'{"text": "' + b"x" * 5000 + b'"}\n')
    with pytest.raises(InputError, match="longer than 1000 bytes") as info:
        prepare_job(request(tmp_path / "job", data, 1, max_line_bytes=1000))
    assert info.value.where.endswith("huge.jsonl:2")


def test_accepted_quirks_bom_crlf_and_no_final_newline(tmp_path):
    data = tmp_path / "quirks.jsonl"
    data.write_bytes(b'\xef\xbb\xbf{"id": 0}\r\n{"id": 1}\r\n  {"id": 2}  \n{"id": 3}')
    outcome = prepare_job(request(tmp_path / "job", data, 1))
    shard = (tmp_path / "job" / "shards" / "part-00000-of-00001.jsonl").read_bytes()
    assert shard == b'{"id": 0}\n{"id": 1}\n{"id": 2}\n{"id": 3}\n'
    assert outcome.manifest.total_rows == 4
    assert outcome.manifest.inputs[0].sha256 == hashlib.sha256(data.read_bytes()).hexdigest()


def test_unchanged_rows_keep_their_bytes_changed_rows_are_canonical(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_bytes(b'{"n": 1.0E5, "s": "\\u00e9", "big": 123456789012345678901234567890}\n{"images": ["a.jpg"]}\n')
    prepare_job(request(tmp_path / "job", data, 1))
    lines = (tmp_path / "job" / "shards" / "part-00000-of-00001.jsonl").read_bytes().splitlines()
    assert lines[0] == b'{"n": 1.0E5, "s": "\\u00e9", "big": 123456789012345678901234567890}'
    assert lines[1] == json.dumps({"images": [str(tmp_path / "a.jpg")]}, separators=(",", ":")).encode()


def test_media_paths_single_file_are_relative_to_its_directory(tmp_path):
    row = {
        "images": ["img/1.jpg", "/abs/2.jpg", "https://x/3.jpg", "s3://b/4.jpg", "oss://b/5.jpg", "hdfs://n/6"],
        "audios": None,
        "videos": ["v.mp4"],
        "other": ["not/media.txt"],
    }
    data = write_rows(tmp_path / "sub" / "in.jsonl", [row])
    prepare_job(request(tmp_path / "job", data, 1))
    out = json.loads((tmp_path / "job" / "shards" / "part-00000-of-00001.jsonl").read_text())
    assert out["images"] == [str(tmp_path / "sub" / "img/1.jpg"), *row["images"][1:]]
    assert out["audios"] is None
    assert out["videos"] == [str(tmp_path / "sub" / "v.mp4")]
    assert out["other"] == ["not/media.txt"]


def test_custom_media_keys_and_directory_root_base(tmp_path):
    root = tmp_path / "ds"
    write_rows(root / "nested" / "a.jsonl", [{"pics": ["p.png"], "images": ["i.png"]}])
    prepare_job(request(tmp_path / "job", root, 1, media_keys={"image_key": "pics"}))
    out = json.loads((tmp_path / "job" / "shards" / "part-00000-of-00001.jsonl").read_text())
    assert out["pics"] == [str(root / "p.png")], "relative to the dataset root, not the file's directory"
    assert out["images"] == ["i.png"], "not a media key in this recipe"


def test_directory_order_is_by_relative_posix_path_and_index_is_global(tmp_path):
    root = tmp_path / "ds"
    write_rows(root / "b.jsonl", [{"src": "b"}])
    write_rows(root / "a" / "2.jsonl", [{"src": "a/2"}, {"src": "a/2", "idx": 99}])
    write_rows(root / "a" / "10.jsonl", [{"src": "a/10"}])
    (root / "notes.txt").write_text("ignored")
    write_rows(root / "empty.jsonl", [])
    outcome = prepare_job(request(tmp_path / "job", root, 2, index_key="idx"))
    assert [f.relpath for f in outcome.manifest.inputs] == ["a/10.jsonl", "a/2.jsonl", "b.jsonl", "empty.jsonl"]
    rows = [json.loads(line) for p in sorted((tmp_path / "job" / "shards").iterdir()) for line in p.open()]
    assert [(r["src"], r["idx"]) for r in rows] == [("a/10", 0), ("a/2", 1), ("a/2", 99), ("b", 3)]


def test_prepare_is_deterministic_and_balanced(tmp_path):
    rows = [{"id": i, "text": "y" * (i * 37 % 200)} for i in range(300)]
    data = write_rows(tmp_path / "in.jsonl", rows)
    a = prepare_job(request(tmp_path / "a", data, 7)).manifest
    b = prepare_job(request(tmp_path / "b", data, 7)).manifest
    assert a.shards == b.shards and a.content_sha256 == b.content_sha256
    assert len(a.shards) == 7 and all(s.rows > 0 for s in a.shards)
    biggest_row = max(len(json.dumps(r)) + 1 for r in rows)
    for s in a.shards:
        assert abs(s.bytes - a.total_bytes / 7) <= biggest_row
    joined = b"".join((tmp_path / "a" / "shards" / f"{s.shard_id}.jsonl").read_bytes() for s in a.shards)
    assert hashlib.sha256(joined).hexdigest() == a.content_sha256
    assert [json.loads(line)["id"] for line in joined.splitlines()] == list(range(300))
    assert not [n for n in os.listdir(tmp_path / "a") if n.startswith(".staging")]


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 500), min_size=1, max_size=60), data=st.data())
def test_splitter_always_gives_n_nonempty_contiguous_shards(tmp_path_factory, sizes, data):
    n = data.draw(st.integers(1, len(sizes)))
    out = tmp_path_factory.mktemp("split")
    splitter = ShardSplitter(out, n, len(sizes), sum(sizes))
    rows = [(b"%d:" % i).ljust(size - 1, b"x")[: max(size - 1, 0)] + b"\n" for i, size in enumerate(sizes)]
    for row in rows:
        splitter.add(row)
    entries = splitter.finish()
    assert len(entries) == n and all(e.rows >= 1 for e in entries)
    assert b"".join((out / f"{e.shard_id}.jsonl").read_bytes() for e in entries) == b"".join(rows)


def test_too_many_shards_and_empty_input(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(3))
    with pytest.raises(ConfigError, match="more than the 3 input rows") as info:
        prepare_job(request(tmp_path / "job", data, 4))
    assert "at most 3" in info.value.hint
    empty = write_rows(tmp_path / "empty.jsonl", [])
    with pytest.raises(InputError, match="no rows"):
        prepare_job(request(tmp_path / "job2", empty, 1))
    with pytest.raises(InputError, match="does not exist"):
        prepare_job(request(tmp_path / "job3", tmp_path / "missing.jsonl", 1))
    with pytest.raises(ConfigError):
        prepare_job(request(tmp_path / "job4", data, 0))


def test_job_dir_inside_dataset_dir_is_refused(tmp_path):
    write_rows(tmp_path / "ds" / "a.jsonl", make_rows(3))
    with pytest.raises(ConfigError, match="inside the dataset"):
        prepare_job(request(tmp_path / "ds" / "job", tmp_path / "ds", 1))


def test_idempotent_rerun_and_refusal_of_a_different_job(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(20))
    first = prepare_job(request(tmp_path / "job", data, 4))
    again = prepare_job(request(tmp_path / "job", data, 4))
    assert first.created and not again.created and again.manifest.job_id == first.manifest.job_id
    with pytest.raises(JobDirError, match="num_shards was 4, now 5") as info:
        prepare_job(request(tmp_path / "job", data, 5))
    assert "new job_dir" in info.value.hint
    with pytest.raises(JobDirError, match=re.escape("the recipe changed: process[0] demo_mapper: removed")):
        prepare_job(request(tmp_path / "job", data, 4, recipe={"process": []}))
    with pytest.raises(JobDirError, match="the operators' code changed: other would compute differently"):
        prepare_job(request(tmp_path / "job", data, 4, stage_identities=["stage-b:other"]))
    assert load_recipe(tmp_path / "job") == first.manifest.recipe


def test_a_changed_recipe_is_refused_naming_the_changed_keys_in_recipe_terms(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(20))
    ops = [
        {"whitespace_normalization_mapper": {"x": 1}},
        {"clean_links_mapper": {}},
        {"text_length_filter": {"min_len": 10}},
    ]
    prepare_job(request(tmp_path / "job", data, 4, recipe={"text_keys": "text", "process": ops}))
    changed = [*ops[:2], {"text_length_filter": {"min_len": 20}}]
    with pytest.raises(JobDirError) as info:
        prepare_job(request(tmp_path / "job", data, 4, recipe={"text_keys": "content", "process": changed}))
    message = str(info.value)
    assert "process[2] text_length_filter.min_len: 10 -> 20" in message
    assert "text_keys: 'text' -> 'content'" in message
    assert "hash" not in message and "stage" not in message
    inserted = [{"words_num_filter": {"min_num": 3}}, *ops]  # one insertion, not every later operator changed
    with pytest.raises(JobDirError) as info:
        prepare_job(request(tmp_path / "job", data, 4, recipe={"text_keys": "text", "process": inserted}))
    assert str(info.value).count("process[") == 1 and "process[0] words_num_filter: added" in str(info.value)


def test_input_changed_since_prepare_shows_old_and_new_sha(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(20))
    old = prepare_job(request(tmp_path / "job", data, 4)).manifest.inputs[0].sha256
    write_rows(data, make_rows(21))
    new = hashlib.sha256(data.read_bytes()).hexdigest()
    with pytest.raises(InputChangedError) as info:
        prepare_job(request(tmp_path / "job", data, 4))
    assert old in info.value.message and new in info.value.message


def test_input_changed_while_prepare_reads_it_is_detected(tmp_path):
    # Prepare reads each input once; a change during that read (here: right after the
    # last block, before the closing stat) must fail, showing the sha read and the sha now.
    data = write_rows(tmp_path / "in.jsonl", make_rows(20))
    old = hashlib.sha256(data.read_bytes()).hexdigest()
    opened = []

    def hook(op, path):
        if op == "open" and path == data:
            opened.append(path)
        elif op == "stat" and path == data and len(opened) == 1:  # the stat right after the read
            opened.append(path)
            content = data.read_bytes()
            data.write_bytes(content.replace(b"row 5", b"row 6", 1))

    fault_seam.set_fault_hook(hook)
    try:
        with pytest.raises(InputChangedError) as info:
            prepare_job(request(tmp_path / "job", data, 4))
    finally:
        fault_seam.set_fault_hook(None)
    new = hashlib.sha256(data.read_bytes()).hexdigest()
    assert old in info.value.message and new in info.value.message
    assert info.value.where == str(data)
    assert not (tmp_path / "job" / "manifest.json").exists()


def test_crash_before_manifest_then_rerun_completes(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(20))
    job = tmp_path / "job"

    def hook(op, path):
        if op == "link" and path.name == "manifest.json":
            raise OSError(5, "simulated crash")

    fault_seam.set_fault_hook(hook)
    try:
        with pytest.raises(JobDirError, match="storage error: simulated crash"):  # one line, not a traceback
            prepare_job(request(job, data, 4))
    finally:
        fault_seam.set_fault_hook(None)
    assert (job / "shards").is_dir() and not (job / "manifest.json").exists()
    with pytest.raises(JobDirError, match="different, unfinished prepare"):
        prepare_job(request(job, data, 3))
    assert prepare_job(request(job, data, 4)).created


def _prepare_in_process(args):
    job, data = args
    outcome = prepare_job(request(job, data, 4))
    return outcome.created, outcome.manifest.job_id


def test_concurrent_preparers_elect_exactly_one(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(200))
    job = tmp_path / "job"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        results = pool.map(_prepare_in_process, [(job, data)] * 4)
    assert sum(created for created, _ in results) == 1
    assert len({job_id for _, job_id in results}) == 1


def test_load_manifest_missing_corrupt_and_inconsistent(tmp_path, job):
    with pytest.raises(JobDirError, match="not prepared") as info:
        load_manifest(tmp_path / "nothing")
    assert "prepare" in info.value.hint
    layout = JobLayout(job)
    good = layout.manifest.read_bytes()
    layout.manifest.write_bytes(good[: len(good) // 2])
    with pytest.raises(JobDirError, match="corrupt manifest"):
        load_manifest(job)
    obj = json.loads(good)
    obj["shards"][1]["rows"] += 1
    layout.manifest.write_text(json.dumps(obj))
    with pytest.raises(JobDirError, match="inconsistent manifest"):
        load_manifest(job)
    obj = json.loads(good)
    del obj["shards"][2]
    layout.manifest.write_text(json.dumps(obj))
    with pytest.raises(JobDirError, match="4 but 3 shards"):
        load_manifest(job)


def test_media_key_set_to_null_normalises_nothing(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", [{"images": ["a.jpg"]}])
    outcome = prepare_job(request(tmp_path / "job", data, 1, media_keys={"image_key": None, "audio_key": "audios"}))
    assert outcome.manifest.media_keys == {"audio_key": "audios"}
    assert json.loads((tmp_path / "job" / "shards" / "part-00000-of-00001.jsonl").read_text()) == {"images": ["a.jpg"]}
    again = prepare_job(request(tmp_path / "job", data, 1, media_keys={"image_key": None, "audio_key": "audios"}))
    assert not again.created


def test_data_juicer_input_order_is_the_default_executors(tmp_path):
    """elastic.input_order: data_juicer lists a directory as Data-Juicer's default executor does
    (its own find_files_with_suffix: rglob order, grouped by suffix); sorted stays the default."""
    import gzip
    from pathlib import Path

    import zstandard
    from data_juicer.format.json_formatter import JsonFormatter
    from data_juicer.utils.file_utils import find_files_with_suffix

    from data_juicer_elastic.shards.prepare import discover_inputs

    data = tmp_path / "data"
    row = b'{"text": "x"}\n'
    for rel in ("z.jsonl", "b/a.jsonl.gz", "a.jsonl", "m/k/q.jsonl", "c.jsonl.zst", "b/x.jsonl"):
        path = data / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        # Data-Juicer tells compressed files by their magic number, so they must be real
        compress = {".gz": gzip.compress, ".zst": zstandard.ZstdCompressor().compress}.get(path.suffix, bytes)
        path.write_bytes(compress(row))
    groups = find_files_with_suffix(data, JsonFormatter.SUFFIXES)
    theirs = [str(Path(p).relative_to(data)) for files in groups.values() for p in files]
    assert len(theirs) == 6
    assert [i.relpath for i in discover_inputs(data, "data_juicer")] == theirs
    assert [i.relpath for i in discover_inputs(data)] == sorted(theirs)
