"""shards.parts and shards.verify: a parts export is the accepted outputs, hard-linked in input
order with an index; publishing it reads no output; verify re-hashes it and names what was tampered
with; merge refuses what is not this job's export (real files, the Ray-free runner)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import ConfigError, IntegrityError, OutputExistsError
from data_juicer_elastic.finalize import finalize
from data_juicer_elastic.jobdir.exports import PARTS_INDEX, MergeRecord, PartsIndex, export_stats_path
from data_juicer_elastic.jobdir.records import ShardResult
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards import parts, verify
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.parts import publish_parts
from data_juicer_elastic.shards.prepare import prepare_job
from data_juicer_elastic.shards.verify import verify_job

from ..faults.crashpoints import FaultRule, injected
from ..rayfree import rayfree_runner
from .conftest import copy_runner, identity, make_rows, request, write_rows

LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=0.2, max_retries=0)
STATS = "__dj__stats__"
SHARD2 = "part-00002-of-00004"


def finished(tmp: Path, shards: int = 4, rows: int = 40, stats: bool = True) -> Path:
    """A finished job whose outputs the real row writer made (row stats when the rows hold stats)."""
    data = [{**row, STATS: {"len": len(row["text"])}} if stats else row for row in make_rows(rows)]
    job = tmp / "job"
    prepare_job(request(job, write_rows(tmp / "in.jsonl", data), shards))
    assert run_worker(job, identity(), rayfree_runner(job), WorkerSettings(**LEASE)).complete
    return job


def results(job: Path) -> list[ShardResult]:
    return [ShardResult.parse(p.read_bytes(), p) for p in sorted((job / "done").iterdir())]


def names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_parts_are_the_accepted_outputs_in_input_order_with_their_stats_and_an_index(tmp_path):
    job = finished(tmp_path)
    export = tmp_path / "out" / "parts"
    result = finalize(job, export, layout="parts")
    assert (result.layout, result.rows, result.shards, result.written) == ("parts", 40, 4, True)
    ids = [f"part-0000{i}-of-00004" for i in range(4)]
    assert names(export) == sorted([PARTS_INDEX, *(f"{s}.jsonl" for s in ids), *(f"{s}.stats" for s in ids)])
    for shard, accepted in zip(ids, results(job), strict=True):
        same = os.path.samestat((export / f"{shard}.jsonl").stat(), (job / accepted.output).stat())
        assert same, "a part is the accepted output itself (hard link), not a copy"
        assert (job / accepted.output).exists(), "the attempt output stays where verify and retry look"
    record = MergeRecord.parse((job / "merge.json").read_bytes(), "merge.json")
    assert record.layout == "parts" and record.output_path == str(export)
    assert verify_job(job).export.files == 9
    merged = tmp_path / "merged.jsonl"
    merge_job(job, merged)
    assert b"".join((export / f"{s}.jsonl").read_bytes() for s in ids) == merged.read_bytes()
    stats = b"".join((export / f"{s}.stats").read_bytes() for s in ids)
    assert stats == export_stats_path(merged).read_bytes()
    index = PartsIndex.parse((export / PARTS_INDEX).read_bytes(), "index")
    assert [p.name for p in index.parts] == [f"{s}.jsonl" for s in ids]
    assert (index.rows, index.bytes, index.num_parts) == (40, merged.stat().st_size, 4)
    assert [p.sha256 for p in index.parts] == [r.sha256 for r in results(job)]
    assert (tmp_path / "out" / "parts_overall_stats.csv").is_file(), "overall stats beside the directory"
    assert [n for n in names(tmp_path / "out") if n.startswith(".")] == [], "no staging left"


def test_publishing_reads_no_output_and_publishing_again_changes_nothing(tmp_path, monkeypatch):
    job = finished(tmp_path)
    export = tmp_path / "parts"

    def no_reading(*args, **kwargs):
        raise AssertionError("an output was read")

    for module in (verify, parts):
        monkeypatch.setattr(module, "check_published_file", no_reading, raising=False)
    monkeypatch.setattr("data_juicer_elastic.jobdir.exports.validate_jsonl_output", no_reading)
    monkeypatch.setattr("data_juicer_elastic.stats.overall._summarise_output", no_reading)
    first = finalize(job, export, layout="parts")
    index_mtime = (export / PARTS_INDEX).stat().st_mtime_ns
    again = finalize(job, export, layout="parts")
    assert first.written and not again.written and again.sha256 == first.sha256
    assert (export / PARTS_INDEX).stat().st_mtime_ns == index_mtime


def test_across_filesystems_each_part_is_a_copy_checked_against_its_marker(tmp_path):
    job = finished(tmp_path, stats=False)
    export = tmp_path / "parts"
    with injected(FaultRule("link", "EXDEV", path=str(tmp_path / ".parts.tmp-"), times=None)):
        publish_parts(job, export)
    first = results(job)[0]
    assert not os.path.samestat((export / f"{first.shard_id}.jsonl").stat(), (job / first.output).stat())
    assert verify_job(job).export.files == 5
    output = job / results(job)[2].output
    output.write_bytes(output.read_bytes().replace(b"row", b"raw", 1))  # same size: only a read sees it
    with injected(FaultRule("link", "EXDEV", path=".parts2.tmp-", times=None)), pytest.raises(IntegrityError) as info:
        publish_parts(job, tmp_path / "parts2")
    assert SHARD2 in info.value.where and "retry" in info.value.hint
    assert not (tmp_path / "parts2").exists() and [n for n in names(tmp_path) if n.startswith(".parts2")] == []


def test_tampering_with_a_part_is_named_by_verify_and_by_merge(tmp_path):
    job = finished(tmp_path, stats=False)
    export = tmp_path / "parts"
    publish_parts(job, export)
    part = export / f"{SHARD2}.jsonl"
    data = part.read_bytes()
    part.write_bytes(data[:3] + bytes([data[3] ^ 0x01]) + data[4:])  # in place: the accepted output too
    with pytest.raises(IntegrityError) as info:
        verify_job(job)
    assert SHARD2 in str(info.value) and "retry" in info.value.hint
    part.write_bytes(data + b'{"id": 99}\n')  # a row added: its size gives it away without a read
    with pytest.raises(IntegrityError) as info:
        publish_parts(job, tmp_path / "other")
    assert SHARD2 in str(info.value)
    part.write_bytes(data)
    assert verify_job(job).export.layout == "parts"


def _linked_part(export: Path) -> None:
    """The part replaced by a symlink to a copy of its bytes elsewhere."""
    part = export / f"{SHARD2}.jsonl"
    elsewhere = export.parent / "elsewhere.jsonl"
    elsewhere.write_bytes(part.read_bytes())
    part.unlink()
    part.symlink_to(elsewhere)


@pytest.mark.parametrize(
    "tamper, verify_says, merge_says",
    [
        (lambda e: (e / f"{SHARD2}.jsonl").unlink(), f"{SHARD2}.jsonl is missing", f"{SHARD2}.jsonl is missing"),
        (
            lambda e: (e / "part-00009-of-00010.jsonl").write_text('{"id": 1}\n'),
            "part-00009-of-00010.jsonl is in the export but not in its index",
            "part-00009-of-00010.jsonl, which is not part of this export",
        ),
        (lambda e: (e / PARTS_INDEX).write_bytes((e / PARTS_INDEX).read_bytes()[:50]), "torn", "torn"),
        (lambda e: (e / PARTS_INDEX).unlink(), f"{PARTS_INDEX} is missing", f"holds no {PARTS_INDEX}"),
        (_linked_part, f"{SHARD2}.jsonl is not a regular file", f"{SHARD2}.jsonl is not the file the index names"),
    ],
    ids=["part-missing", "extra-part", "torn-index", "no-index", "part-a-link"],
)
def test_a_damaged_export_fails_verify_and_merge_naming_what_is_wrong(tmp_path, tamper, verify_says, merge_says):
    job = finished(tmp_path, stats=False)
    export = tmp_path / "parts"
    publish_parts(job, export)
    tamper(export)
    with pytest.raises(IntegrityError) as info:
        verify_job(job)
    assert verify_says in str(info.value)
    with pytest.raises(OutputExistsError) as exists:
        publish_parts(job, export)
    assert merge_says in str(exists.value) and "overwrite" in exists.value.hint
    assert publish_parts(job, export, overwrite=True).written
    assert verify_job(job).export.files == 5 and [n for n in names(tmp_path) if n.startswith(".")] == []
    assert not (tmp_path / "elsewhere.jsonl").exists() or (tmp_path / "elsewhere.jsonl").stat().st_size > 0


def test_an_export_whose_index_names_other_bytes_is_refused_naming_both(tmp_path):
    """Another job's (well-formed) index at the target: the refusal names the part that differs with
    what the index there says and what this job's says."""
    import dataclasses

    from data_juicer_elastic.jobdir.exports import PartsIndex

    job = finished(tmp_path, stats=False)
    export = tmp_path / "parts"
    publish_parts(job, export)
    index = PartsIndex.read(export / PARTS_INDEX)
    mine = index.parts[1]
    theirs = dataclasses.replace(mine, rows=mine.rows + 1, sha256="0" * 64)
    other = dataclasses.replace(index, parts=[index.parts[0], theirs, *index.parts[2:]])
    (export / PARTS_INDEX).write_bytes(other.encode())
    with pytest.raises(OutputExistsError) as exists:
        publish_parts(job, export)
    said = str(exists.value)
    assert f"{mine.name} differs (rows={mine.rows + 1} sha256={'0' * 64} there" in said
    assert f"this job's: rows={mine.rows} sha256={mine.sha256})" in said


def test_a_foreign_file_in_the_export_directory_is_refused_even_with_overwrite(tmp_path):
    job = finished(tmp_path, stats=False)
    export = tmp_path / "parts"
    export.mkdir()
    (export / "thesis.tex").write_text("precious")
    for overwrite in (False, True):
        with pytest.raises(ConfigError) as info:
            publish_parts(job, export, overwrite=overwrite)
        assert "thesis.tex" in str(info.value)
    assert names(export) == ["thesis.tex"]


def test_refused_export_paths(tmp_path):
    job = finished(tmp_path, stats=False)
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    cases = [
        (tmp_path / "a-file", "is a file"),
        (tmp_path / "link", "symlink"),
        (job / "parts", "inside the job directory"),
        (tmp_path, "the job directory"),  # the job directory would be inside the export directory
    ]
    for path, says in cases:
        with pytest.raises(ConfigError) as info:
            publish_parts(job, path, overwrite=True)
        assert says in str(info.value), (path, str(info.value))
        assert info.value.exit_code == 2
    assert not (tmp_path / "elsewhere").exists()


def test_another_jobs_export_is_replaced_only_with_overwrite(tmp_path):
    job_a = finished(tmp_path / "a", stats=False)
    job_b = finished(tmp_path / "b", shards=3, stats=False)
    export = tmp_path / "parts"
    publish_parts(job_a, export)
    with pytest.raises(OutputExistsError) as info:
        publish_parts(job_b, export)
    assert "different parts export" in str(info.value)
    assert publish_parts(job_b, export, overwrite=True).written
    assert len([n for n in names(export) if n.endswith(".jsonl")]) == 3
    assert verify_job(job_b).export.files == 4
    assert [n for n in names(tmp_path) if n.startswith(".")] == [], "the replaced export is removed"


def test_a_shard_run_again_makes_the_export_stale_for_verify(tmp_path):
    from data_juicer_elastic.jobdir.retry import retry_shards

    job = finished(tmp_path, stats=False)
    publish_parts(job, tmp_path / "parts")
    output = job / results(job)[1].output
    output.write_text("")  # lost: retry requeues it, a worker runs it again (another attempt)
    retry_shards(job, shard_ids=[results(job)[1].shard_id])
    assert run_worker(job, identity(), rayfree_runner(job), WorkerSettings(**LEASE)).complete
    with pytest.raises(IntegrityError) as info:
        verify_job(job)
    assert "part-00001-of-00004.jsonl is not shard part-00001-of-00004's accepted output" in str(info.value)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shards=st.integers(1, 9), rows=st.integers(0, 40), drop=st.integers(0, 5))
def test_the_parts_in_index_order_are_the_file_layouts_output(tmp_path_factory, shards, rows, drop):
    """For any shard count (and outputs with rows filtered away, empty parts included) the
    concatenation of the parts in index order is byte for byte the merged file of the same job."""
    tmp = tmp_path_factory.mktemp("parts")
    rows = max(rows, shards)
    job = tmp / "job"
    prepare_job(request(job, write_rows(tmp / "in.jsonl", make_rows(rows)), shards))
    runner = copy_runner(lambda row: None if drop and row["id"] % (drop + 1) == 0 else row)
    assert run_worker(job, identity(), runner, WorkerSettings(**LEASE)).complete
    export, merged = tmp / "parts", tmp / "merged.jsonl"
    publish_parts(job, export)
    merge_job(job, merged)
    index = json.loads((export / PARTS_INDEX).read_bytes())
    assert [p["shard_id"] for p in index["parts"]] == [f"part-{i:05d}-of-{shards:05d}" for i in range(shards)]
    assert b"".join((export / p["name"]).read_bytes() for p in index["parts"]) == merged.read_bytes()
    assert index["rows"] == sum(1 for _ in merged.open())


def test_the_closing_summary_names_the_directory_its_index_and_the_stats(tmp_path):
    from data_juicer_elastic.console.summary import summary_lines

    job = finished(tmp_path)
    result = finalize(job, tmp_path / "parts", layout="parts")
    lines = summary_lines(job, result, 12.0, None)
    assert "40 rows out, 4 shards" in lines[0]
    output = f"{tmp_path / 'parts'}{os.sep} (4 parts, in input order by name; index {PARTS_INDEX})"
    assert any(output in line for line in lines)
    assert any("part-*.stats (per row; overall: parts_overall_stats.csv beside it)" in line for line in lines)
