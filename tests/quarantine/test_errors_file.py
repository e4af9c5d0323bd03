"""The quarantine file through the job-directory protocol, without Ray: the workers' records folded into an
attempt's errors.jsonl (input order, input rows byte-exact, Ray's duplicate records once), published with
the result, merged in input order (and by the streaming merge), limited by max_error_rows, and
``retry --quarantined`` running those shards again whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.console.summary import summary_lines
from data_juicer_elastic.errors import (
    ConfigError,
    ElasticError,
    InputChangedError,
    IntegrityError,
    ShardExecutionError,
)
from data_juicer_elastic.jobdir.attempts import ShardOutput, ShardTask
from data_juicer_elastic.jobdir.exports import WORKER_DIR, export_errors_path, read_errors
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.quarantine.collector import allowed_errors, check_limit, fold_errors
from data_juicer_elastic.rows.shard_source import iter_source_lines
from data_juicer_elastic.settings import ElasticSettings
from data_juicer_elastic.shards.merge import follow_merge, merge_job
from data_juicer_elastic.shards.parts import publish_parts
from data_juicer_elastic.shards.verify import verify_job
from data_juicer_elastic.sharedfs.identity import WorkerIdentity
from data_juicer_elastic.status.job_status import snapshot
from data_juicer_elastic.status.job_view import render_text

from ..faults.fakes import LEASE, prepare


def quarantining_runner(bad: set[int]):
    """Copies the rows whose ``id`` is not in ``bad``; records the others as Ray workers would (two
    processes, out of order, one record twice), then folds them as the shard runner does."""

    def run(task: ShardTask) -> ShardOutput:
        lines = list(iter_source_lines(task.source))
        rows = [json.loads(line) for line in lines]
        kept = [line for line, row in zip(lines, rows, strict=True) if row["id"] not in bad]
        failing = [(n, row) for n, row in enumerate(rows) if row["id"] in bad]
        directory = Path(task.attempt_dir) / WORKER_DIR
        directory.mkdir(parents=True, exist_ok=True)
        for k, (n, row) in enumerate(reversed(failing)):
            record = {"n": n, "op": "picky_mapper", "stage": "stage-0001-occ0-ab:picky_mapper", "op_index": 1}
            record |= {"type": "ValueError", "message": f"bad id {row['id']}"}
            lines_out = orjson.dumps(record) + b"\n"
            with open(directory / f"host-{k % 2}.jsonl", "ab") as handle:
                handle.write(lines_out * (2 if k == 0 else 1))  # a task Ray ran twice
        found = fold_errors(
            Path(task.attempt_dir),
            task.shard_id,
            lambda: iter(lines),
            lambda: task.source.first_row,
        )
        Path(task.output_path).write_bytes(b"".join(line + b"\n" for line in kept))
        return ShardOutput(task.output_path, len(kept), errors_path=found.path)

    return run


def work(job: Path, runner) -> None:
    run_worker(job, WorkerIdentity.current(), runner, WorkerSettings(max_retries=0, **LEASE, wait_for_completion=False))


def input_lines(tmp_path: Path) -> list[bytes]:
    return (tmp_path / "job-input.jsonl").read_bytes().splitlines()


def test_a_parts_export_puts_each_shards_quarantined_rows_beside_its_part(tmp_path):
    job = prepare(tmp_path, rows=40, shards=4)
    bad = {3, 4, 17, 39}
    work(job, quarantining_runner(bad))
    merged = tmp_path / "out" / "merged.jsonl"
    merge_job(job, merged)
    export = tmp_path / "parts"
    result = publish_parts(job, export)
    assert result.rows == 36 and result.quarantined is not None and result.quarantined.rows == 4
    errors = sorted(export.glob("*.errors"))
    assert [p.name for p in errors] == ["part-00000-of-00004.errors", "part-00001-of-00004.errors",
                                        "part-00003-of-00004.errors"]  # fmt: skip
    assert b"".join(p.read_bytes() for p in errors) == export_errors_path(merged).read_bytes(), "in input order"
    record = json.loads((job / "merge.json").read_text())
    assert record["layout"] == "parts" and record["errors_rows"] == 4
    assert verify_job(job).output_rows == 36
    # a part's errors file is a link of its attempt's: editing it is caught as the accepted file changed
    errors[1].write_bytes(errors[1].read_bytes().replace(b"bad id", b"BAD id", 1))
    with pytest.raises(IntegrityError, match="part-00001-of-00004: accepted quarantine file does not match"):
        verify_job(job)
    # publishing again finds a replaced errors file (a new file, not the accepted one's link) differs
    errors[2].unlink()
    errors[2].write_bytes(b"{}\n")
    with pytest.raises(ElasticError, match="part-00003-of-00004.errors is not the file the index names"):
        publish_parts(job, export)


def test_quarantined_rows_are_merged_in_input_order_byte_exact_and_retried_whole(tmp_path):
    job = prepare(tmp_path, rows=40, shards=4)
    bad = {3, 4, 17, 39}
    work(job, quarantining_runner(bad))
    merged = tmp_path / "out" / "merged.jsonl"
    result = merge_job(job, merged)
    assert result.rows == 36 and result.quarantined is not None and result.quarantined.rows == 4
    errors_path = export_errors_path(merged)
    assert result.quarantined.path == errors_path
    found = list(read_errors(errors_path))
    assert [e.row_number for e, _ in found] == sorted(bad)
    shards = load_manifest(job).shards
    first = {entry.shard_id: entry.first_row for entry in shards}
    assert [e.shard_row for e, _ in found] == [e.row_number - first[e.shard] for e, _ in found]
    with_errors = sorted({e.shard for e, _ in found})
    assert {e.op for e, _ in found} == {"picky_mapper"} and {e.op_index for e, _ in found} == {1}
    source = input_lines(tmp_path)
    raw = errors_path.read_bytes().splitlines()
    assert [line[line.index(b',"row":') + 7 : -1] for line in raw] == [source[i] for i in sorted(bad)]
    record = json.loads((job / "merge.json").read_text())
    assert record["errors_rows"] == 4 and record["errors_path"] == str(errors_path)
    assert type(result).from_details(result.to_details()).quarantined == result.quarantined
    snap = snapshot(job)
    assert snap.quarantined_rows == 4 and sum(1 for sh in snap.shards if sh.quarantined) == len(with_errors)
    text = render_text(snap)
    assert "36 output rows, 4 quarantined" in text and f"--job-dir {job} --quarantined" in text
    summary = "\n".join(summary_lines(job, result, 1.0, None))
    assert "36 rows out, 4 rows quarantined" in summary and "merged_errors.jsonl (4 rows operators failed on" in summary

    # The streaming merge writes the same file.
    streamed = tmp_path / "out2" / "merged.jsonl"
    follow_merge(job, streamed, wait=False)
    assert export_errors_path(streamed).read_bytes() == errors_path.read_bytes()

    # An altered quarantine file is named, like an altered output.
    done = json.loads((job / "done" / "part-00000-of-00004.json").read_text())
    attempt_errors = job / done["errors"]["path"]
    saved = attempt_errors.read_bytes()
    attempt_errors.write_bytes(saved.replace(b"bad id", b"BAD id", 1))
    with pytest.raises(IntegrityError, match="quarantine file"):
        merge_job(job, tmp_path / "out3" / "merged.jsonl")
    attempt_errors.write_bytes(saved)

    # After the fix: the shards with quarantined rows run again whole; every row once, in input order.
    from data_juicer_elastic.jobdir.retry import retry_shards

    assert retry_shards(job, quarantined=True) == with_errors and len(with_errors) > 1
    assert retry_shards(job, quarantined=True) == []  # nothing done has quarantined rows now
    work(job, quarantining_runner(set()))
    again = merge_job(job, merged, overwrite=True)
    assert again.rows == 40 and again.quarantined is None
    assert merged.read_bytes().splitlines() == source


def test_verify_re_hashes_the_merged_quarantine_file(tmp_path):
    job = prepare(tmp_path, rows=40, shards=4)
    work(job, quarantining_runner({5, 30}))
    merged = tmp_path / "out" / "merged.jsonl"
    merge_job(job, merged)
    assert verify_job(job).export.files == 2  # the output and its quarantine file
    errors = export_errors_path(merged)
    saved = errors.read_bytes()
    errors.write_bytes(saved.replace(b"bad id", b"BAD id", 1))
    with pytest.raises(IntegrityError, match="quarantine file is missing or changed"):
        verify_job(job)
    errors.unlink()
    with pytest.raises(IntegrityError, match="quarantine file is missing or changed"):
        verify_job(job)


def test_limit_count_or_fraction_rounded_up():
    assert allowed_errors(0.01, 4) == 1 and allowed_errors(0.01, 512) == 6 and allowed_errors(0.01, 100) == 1
    assert allowed_errors(0, 10_000) == 0 and allowed_errors(5, 2) == 5 and allowed_errors(0.5, 3) == 2


@pytest.mark.parametrize("value", [-1, 1.5, True, "1%", None])
def test_max_error_rows_is_a_fraction_or_a_whole_count(value):
    with pytest.raises(ConfigError, match="elastic.max_error_rows"):
        ElasticSettings(job_dir="j", max_error_rows=value)
    for good in (0, 0.001, 0.5, 1, 10.0, 1000):
        assert ElasticSettings(job_dir="j", max_error_rows=good).max_error_rows == good


def test_over_the_limit_the_shard_fails_naming_the_first_error(tmp_path):
    job = prepare(tmp_path, rows=40, shards=1)
    attempt = job / "attempts" / "part-00000-of-00001" / "a1"
    (attempt / WORKER_DIR).mkdir(parents=True)
    for n in (30, 2):
        record = {"n": n, "op": "m", "stage": "stage-0000-occ0-x:m", "op_index": 0, "type": "KeyError", "message": "k"}
        with open(attempt / WORKER_DIR / "w.jsonl", "ab") as handle:
            handle.write(orjson.dumps(record) + b"\n")
    lines = input_lines(tmp_path)
    found = fold_errors(attempt, "part-00000-of-00001", lambda: iter(lines), lambda: 0)
    check_limit(found, 2, 40, "shard s")
    with pytest.raises(ShardExecutionError) as info:
        check_limit(found, 0.01, 40, "shard s")
    assert "operators failed on 2 of 40 rows, more than elastic.max_error_rows=0.01 allows (1)" in info.value.message
    assert "the first: op[0] m: KeyError: k (row 2)" in info.value.message and str(found.path) in info.value.hint


def test_the_input_rows_are_read_to_their_end_so_their_source_checks_the_rows_copied(tmp_path):
    """``rows.shard_source`` compares a shard's content with its scan only once it is read whole: the rows
    copied into errors.jsonl are read to the end, past the last failing row, and a source that refuses
    there leaves no errors file (the shard fails; the end-to-end case: tests/e2e/test_quarantine_input_changed.py)."""
    attempt = tmp_path / "attempt"
    (attempt / WORKER_DIR).mkdir(parents=True)
    record = {"n": 1, "op": "m", "stage": "stage-0000-occ0-x:m", "op_index": 0, "type": "KeyError", "message": "k"}
    (attempt / WORKER_DIR / "w.jsonl").write_bytes(orjson.dumps(record) + b"\n")
    read = []

    def changed_input():
        for line in (b'{"id":0}', b'{"id":1}', b'{"id":2}'):
            read.append(line)
            yield line
        raise InputChangedError("input changed since the job was planned and scanned", where="in.jsonl")

    with pytest.raises(InputChangedError):
        fold_errors(attempt, "s", changed_input, lambda: 0)
    assert len(read) == 3 and sorted(os.listdir(attempt)) == [WORKER_DIR], "read whole; nothing written"


def test_only_rows_an_operator_made_read_no_input(tmp_path):
    record = {"n": None, "op": "m", "stage": "stage-0000-occ0-x:m", "op_index": 0, "type": "KeyError"}
    record |= {"message": "k", "seen": {"text": "made"}}
    (tmp_path / WORKER_DIR).mkdir()
    (tmp_path / WORKER_DIR / "w.jsonl").write_bytes(orjson.dumps(record) + b"\n")
    found = fold_errors(tmp_path, "s", lambda: pytest.fail("no input row is copied"), lambda: 0)
    assert found.rows == 1 and b'"row":{"text":"made"}' in found.path.read_bytes()


def test_no_records_no_file(tmp_path):
    found = fold_errors(tmp_path, "s", lambda: pytest.fail("the shard is not read"), lambda: 0)
    assert found.path is None and found.rows == 0 and not os.listdir(tmp_path)
