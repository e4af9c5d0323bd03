from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import ConfigError, InputChangedError, InputError, JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.shards import plan
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.sharedfs import fault_seam

from .conftest import make_rows, request, shard_lines, write_rows

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
    assert shard_lines(tmp_path / "job") == [b'{"id": 0}', b'{"id": 1}', b'{"id": 2}', b'{"id": 3}']
    assert outcome.manifest.total_rows == 4
    # the content the shard hashes to: the file's bytes, given the newline its last line lacked
    assert outcome.manifest.shards[0].sha256 == hashlib.sha256(data.read_bytes() + b"\n").hexdigest()


def test_unchanged_rows_keep_their_bytes_changed_rows_are_canonical(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_bytes(b'{"n": 1.0E5, "s": "\\u00e9", "big": 123456789012345678901234567890}\n{"images": ["a.jpg"]}\n')
    prepare_job(request(tmp_path / "job", data, 1))
    lines = shard_lines(tmp_path / "job")
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
    (out,) = map(json.loads, shard_lines(tmp_path / "job"))
    assert out["images"] == [str(tmp_path / "sub" / "img/1.jpg"), *row["images"][1:]]
    assert out["audios"] is None
    assert out["videos"] == [str(tmp_path / "sub" / "v.mp4")]
    assert out["other"] == ["not/media.txt"]


def test_custom_media_keys_and_directory_root_base(tmp_path):
    root = tmp_path / "ds"
    write_rows(root / "nested" / "a.jsonl", [{"pics": ["p.png"], "images": ["i.png"]}])
    prepare_job(request(tmp_path / "job", root, 1, media_keys={"image_key": "pics"}))
    (out,) = map(json.loads, shard_lines(tmp_path / "job"))
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
    rows = [json.loads(line) for line in shard_lines(tmp_path / "job")]
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
    assert [json.loads(line)["id"] for line in shard_lines(tmp_path / "a")] == list(range(300))
    raw = data.read_bytes()  # each shard is its byte range of the input: hashed as it stands
    for s in a.shards:
        (span,) = s.spans
        assert hashlib.sha256(raw[span.offset : span.offset + span.length]).hexdigest() == s.sha256


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 500), min_size=1, max_size=60), data=st.data())
def test_the_row_rule_gives_n_nonempty_contiguous_shards_cut_nearest_their_targets(sizes, data):
    n = data.draw(st.integers(1, len(sizes)))
    ends = list(itertools.accumulate(sizes))
    total = ends[-1]
    cuts = plan._row_rule(ends, total, n)
    bounds = [0, *cuts, total]
    assert len(cuts) == n - 1 and all(a < b for a, b in zip(bounds, bounds[1:], strict=False)), "n non-empty shards"
    assert set(cuts) <= set(ends), "every cut at a row end"
    for k, cut in enumerate(cuts):
        # the row end nearest the target (ties: the earlier one) among those that leave this shard
        # non-empty and a row for every later shard (exact arithmetic: distances times n)
        allowed = [e for i, e in enumerate(ends) if e > bounds[k] and len(ends) - 1 - i >= n - 1 - k]
        assert cut == min(allowed, key=lambda e: (abs(n * e - total * (k + 1)), e))


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
    assert json.loads(JobLayout(tmp_path / "job").recipe.read_bytes()) == first.manifest.recipe  # untouched


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


def test_input_changed_since_prepare_shows_old_and_new_size(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(20))
    old = prepare_job(request(tmp_path / "job", data, 4)).manifest.inputs[0].size
    write_rows(data, make_rows(21))
    with pytest.raises(InputChangedError) as info:
        prepare_job(request(tmp_path / "job", data, 4))
    assert f"size {old} -> {data.stat().st_size}" in info.value.message


def test_crash_before_the_plan_then_rerun_completes(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(20))
    job = tmp_path / "job"

    def hook(op, path):
        if op == "link" and path.name == "plan.json":
            raise OSError(5, "simulated crash")

    fault_seam.set_fault_hook(hook)
    try:
        with pytest.raises(JobDirError, match="storage error: simulated crash"):  # one line, not a traceback
            prepare_job(request(job, data, 4))
    finally:
        fault_seam.set_fault_hook(None)
    assert (job / "recipe.json").exists() and not (job / "plan.json").exists()
    with pytest.raises(JobDirError, match="recipe of a different job"):  # the recipe placed is another's
        prepare_job(request(job, data, 4, recipe={"process": []}))
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
    assert [json.loads(line) for line in shard_lines(tmp_path / "job")] == [{"images": ["a.jpg"]}]
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

    from data_juicer_elastic.shards.plan import discover_inputs

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
