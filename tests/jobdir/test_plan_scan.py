"""Planning, scanning and composing a job, checked against the input itself.

The oracle for every shard layout is the input read whole, row by row, with the row policy
(``RowNormaliser`` over each file in order): whatever the plan's cuts, whichever copy mode,
the shards' rows in order are exactly those rows, the refused input names the same
``file:line`` as a whole-file read would, and the manifest does not depend on who scanned what.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import ConfigError, InputChangedError, InputError, JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import compose_manifest, load_manifest, load_plan, locate_shard
from data_juicer_elastic.jobdir.shard_state import read_scans
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.rows.jsonl import NormaliseOptions, RowNormaliser
from data_juicer_elastic.rows.shard_source import iter_content, iter_source_lines
from data_juicer_elastic.shards import plan as planner
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.prepare import PrepareRequest, plan_job, prepare_job

from .conftest import copy_runner, identity, scan_locally

LEASE = {"ttl_secs": 60, "heartbeat_secs": 10, "poll_interval_secs": 0.05}
ROW = st.fixed_dictionaries(
    {
        "text": st.text(max_size=12),
        "n": st.integers(-(2**70), 2**70),
        "x": st.floats(allow_nan=False, allow_infinity=False),
    },
    optional={"images": st.lists(st.sampled_from(["a.png", "/abs/b.png", "http://h/c.png"]), max_size=2)},
)


def write_inputs(root: Path, files: list[list[dict]], crlf: bool, bom: bool, no_final_newline: bool, gz: int) -> Path:
    data = root / "data"
    data.mkdir()
    for i, rows in enumerate(files):
        ending = "\r\n" if crlf and i % 2 else "\n"
        text = "".join(json.dumps(r, ensure_ascii=i % 2 == 0) + ending for r in rows)
        if no_final_newline and text:
            text = text[: -len(ending)]
        raw = (b"\xef\xbb\xbf" if bom and i == 0 and text else b"") + text.encode()
        if i < gz:
            (data / f"f{i:02d}.jsonl.gz").write_bytes(gzip.compress(raw, mtime=0))
        else:
            (data / f"f{i:02d}.jsonl").write_bytes(raw)
    return data


def reference_rows(data: Path) -> list[bytes]:
    """Every row as prepare's row policy gives it, reading each file whole, in order."""
    options = NormaliseOptions(base_dir=str(data), media_keys={"image_key": "images"}, index_key=None)
    out, first = [], 0
    for path in sorted(data.iterdir()):
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        lines = raw.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        if not lines:
            continue
        normaliser = RowNormaliser(str(path), options, first)
        normalised = normaliser.lines(lines)
        out += lines if normalised is None else normalised
        first += normaliser.rows
    return [line.removesuffix(b"\r") if line.endswith(b"\r") else line for line in out]


def request(root: Path, data: Path, n: int, copy: bool, job: str = "job") -> PrepareRequest:
    return PrepareRequest(
        job_dir=root / job,
        dataset_path=data,
        num_shards=n,
        recipe={"process": []},
        stage_identities=[],
        media_keys={"image_key": "images"},
        copy_shards=copy,
    )


def shard_rows(job: Path) -> list[bytes]:
    layout, manifest = JobLayout(job), load_manifest(job)
    return [line for e in manifest.shards for line in iter_source_lines(locate_shard(layout, manifest, e))]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.lists(st.lists(ROW, max_size=12), min_size=1, max_size=4),
    crlf=st.booleans(),
    bom=st.booleans(),
    no_final_newline=st.booleans(),
    gz=st.integers(0, 2),
    n=st.integers(1, 9),
    exact_per_cut=st.sampled_from([planner.EXACT_BYTES_PER_CUT, 1]),
)
def test_shards_hold_exactly_the_input_rows_whatever_the_cuts(
    tmp_path_factory, monkeypatch, files, crlf, bom, no_final_newline, gz, n, exact_per_cut
):
    root = tmp_path_factory.mktemp("plan")
    data = write_inputs(root, files, crlf, bom, no_final_newline, gz)
    expected = [json.loads(line) for line in reference_rows(data)]
    if not expected:
        return
    # exact_per_cut=1: every cut is placed by a short read near its target (the large-input path)
    monkeypatch.setattr(planner, "EXACT_BYTES_PER_CUT", exact_per_cut)
    try:
        plan = plan_job(request(root, data, n, False)).plan
    except ConfigError as exc:  # only the exact planner refuses more shards than plain rows
        assert "num_shards" in str(exc) and n > len(expected) and not gz
        return
    scan_locally(root / "job")
    manifest = load_manifest(root / "job")
    assert [json.loads(line) for line in shard_rows(root / "job")] == expected
    assert manifest.total_rows == len(expected)
    # The exact rule (these inputs are far below EXACT_BYTES_PER_CUT per cut unless it is patched to 1)
    # never leaves a shard empty.  Cuts near their targets may: a line holding two targets leaves the
    # shard between them empty, so only the exact planner is held to this.
    if exact_per_cut > 1 and n <= len(expected) and not gz:
        assert all(e.rows >= 1 for e in manifest.shards)
    if exact_per_cut == 1:  # the large-input path reads at most one probe per cut (these lines are short)
        assert plan.planned_bytes_read <= (n - 1) * planner._PROBE_BYTES


def test_copied_shards_hold_the_same_content_as_shards_read_in_place(tmp_path):
    data = write_inputs(
        tmp_path, [[{"a": i, "images": ["x.png"]} for i in range(30)], [{"b": 1}] * 5], True, True, True, 1
    )
    expected = [json.loads(line) for line in reference_rows(data)]
    manifests = []
    for copy in (False, True):
        manifests.append(prepare_job(request(tmp_path, data, 4, copy, job=f"job-{copy}")).manifest)
        assert [json.loads(line) for line in shard_rows(tmp_path / f"job-{copy}")] == expected
    zero_copy, copied = manifests
    assert [(e.rows, e.bytes, e.sha256) for e in zero_copy.shards] == [
        (e.rows, e.bytes, e.sha256) for e in copied.shards
    ]
    assert sorted(p.name for p in (tmp_path / "job-True" / "shards").iterdir()) == [
        f"{shard}.jsonl" for shard in copied.shard_ids
    ]


def test_a_refused_row_names_the_same_file_line_as_a_whole_file_read(tmp_path):
    rows = [json.dumps({"i": i}) for i in range(200)]
    rows[137] = '{"i": NaN}'
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text("\n".join(rows[:60]) + "\n")
    (data / "b.jsonl").write_text("\n".join(rows[60:]) + "\n")
    with pytest.raises(InputError) as refused:
        prepare_job(request(tmp_path, data, 9, False))
    assert refused.value.where == f"{data / 'b.jsonl'}:{137 - 60 + 1}"
    assert "NaN" in refused.value.message
    assert not (tmp_path / "job" / "manifest.json").exists()  # nothing may run


def test_the_manifest_is_the_same_whoever_scans_and_composes(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"k": i, "v": "x" * (i % 7)}) + "\n" for i in range(300)))
    prepare_job(request(tmp_path, data, 7, False))
    layout = JobLayout(tmp_path / "job")
    plan = load_plan(layout.root)
    results = read_scans(layout, plan)
    shuffled = dict(random.Random(3).sample(sorted(results.items()), len(results)))
    assert compose_manifest(plan, shuffled).encode() == load_manifest(layout.root).encode()


def test_a_tampered_scan_record_is_refused_before_anything_runs(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"k": i}) + "\n" for i in range(50)))
    prepare_job(request(tmp_path, data, 3, False))
    layout = JobLayout(tmp_path / "job")
    record = layout.scans.done("part-00001-of-00003")
    text = record.read_text()
    record.write_text(text.replace('"rows": 17', '"rows": 18', 1))
    (layout.root / "manifest.json").unlink()  # composed again from the records as they are now
    with pytest.raises(JobDirError) as refused:
        read_scans(layout, load_plan(layout.root))
    assert "checksum" in refused.value.message and refused.value.where == str(record)


def test_an_input_changed_after_its_scan_is_never_read(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"k": i}) + "\n" for i in range(50)))
    manifest = prepare_job(request(tmp_path, data, 2, False)).manifest
    layout = JobLayout(tmp_path / "job")
    with data.open("r+b") as handle:  # same size, one digit changed, mtime moved back
        handle.seek(10)
        handle.write(b"9")
    source = locate_shard(layout, manifest, manifest.shards[0])
    st_ = manifest.inputs[0]
    import os

    os.utime(data, ns=(st_.mtime_ns, st_.mtime_ns))  # metadata as planned: only the content tells
    with pytest.raises(InputChangedError) as changed:
        list(iter_content(source))
    assert str(data) in str(changed.value) and "sha256" in changed.value.message


def test_large_inputs_are_planned_by_short_reads_near_each_cut(tmp_path, monkeypatch):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"k": i, "pad": "p" * (i % 50)}) + "\n" for i in range(20000)))
    monkeypatch.setattr(planner, "EXACT_BYTES_PER_CUT", 1)
    outcome = plan_job(request(tmp_path, data, 16, False))
    plan = outcome.plan
    assert plan.planned_bytes_read <= 15 * 64 * 1024  # one probe read per cut
    raw = data.read_bytes()
    for entry in plan.shards:
        (span,) = entry.spans
        assert span.offset == 0 or raw[span.offset - 1 : span.offset] == b"\n"  # every cut at a line end


def test_shards_a_compressed_file_leaves_empty_are_done_without_running_anything(tmp_path):
    """A compressed file is never cut: with more shards than files, some shards hold nothing. They
    are scanned and published like any shard, but no runner is called for them; the merge is exact."""
    rows = [{"k": i} for i in range(20)]
    data = tmp_path / "data.jsonl.gz"
    data.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode(), mtime=0))
    manifest = prepare_job(request(tmp_path, data, 3, False)).manifest
    assert sorted(e.rows for e in manifest.shards) == [0, 0, 20]
    ran = []

    def runner(task):
        ran.append(task.shard_id)
        return copy_runner()(task)

    summary = run_worker(tmp_path / "job", identity(), runner, WorkerSettings(max_retries=0, **LEASE))
    assert summary.complete and ran == [e.shard_id for e in manifest.shards if e.rows]
    merge_job(tmp_path / "job", tmp_path / "out.jsonl")
    assert [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()] == rows


def test_the_composer_warns_once_where_operators_see_a_value_in_another_type(tmp_path):
    from loguru import logger

    data = tmp_path / "in.jsonl"
    # "meta" has different keys in different rows: operators see it as one struct with nulls filled in
    rows = [{"text": "a", "meta": {"a": 1}}, {"text": "b", "meta": {"b": 2}}] * 20
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    warnings: list[str] = []
    sink = logger.add(lambda message: warnings.append(message.record["message"]), level="WARNING")
    try:
        prepare_job(request(tmp_path, data, 3, False))  # scanned here: this call composes the manifest
        prepare_job(request(tmp_path, data, 3, False))  # the job again: already composed, nothing new to say
    finally:
        logger.remove(sink)
    assert len(warnings) == 1 and "meta" in warnings[0] and "docs/lossless.md" in warnings[0]


def test_a_cut_whose_target_is_where_a_file_begins_falls_between_the_files(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a", "b"):  # two files of the same size: the one cut of two shards aims at b's first byte
        (data / f"{name}.jsonl").write_text("".join(json.dumps({"f": name, "i": i}) + "\n" for i in range(5)))
    monkeypatch.setattr(planner, "EXACT_BYTES_PER_CUT", 1)  # the short read near the target (large inputs)
    plan = plan_job(request(tmp_path, data, 2, False)).plan
    assert [[(s.input, s.offset) for s in e.spans] for e in plan.shards] == [[(0, 0)], [(1, 0)]]
    scan_locally(tmp_path / "job")
    assert [json.loads(line)["f"] for line in shard_rows(tmp_path / "job")] == ["a"] * 5 + ["b"] * 5
