"""After `dj-elastic retry` a job's result differs from the export it published: the next merge replaces the
export without `overwrite` when merge.json proves the job wrote it (its sha256), and only then; and the
operator code a retry accepted (`code-changes/`) is what workers check, a damaged record an error."""

from __future__ import annotations

import json

import pytest

from data_juicer_elastic.errors import JobDirError, OutputExistsError
from data_juicer_elastic.jobdir import retry
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.retry import change_path, job_code, latest_change, record_change, retry_shards
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.sharedfs import fsio

from .conftest import copy_runner, identity

LEASE = dict(ttl_secs=60.0, heartbeat_secs=10.0, poll_interval_secs=1.0)
SHARD = "part-00001-of-00004"


def _run(job, version: int) -> None:
    runner = copy_runner(lambda row: {**row, "version": version})
    run_worker(job, identity(), runner, WorkerSettings(max_retries=1, wait_for_completion=False, **LEASE))


def _requeue(job) -> None:
    """A done shard requeued (its accepted output lost), so its next result differs."""
    result = json.loads((job / "done" / f"{SHARD}.json").read_text())
    (job / result["output"]).unlink()
    assert retry_shards(job, [SHARD]) == [SHARD]


def test_a_merge_replaces_the_export_this_job_wrote_and_nothing_else(job, tmp_path):
    out = tmp_path / "out" / "merged.jsonl"
    _run(job, 1)
    merge_job(job, out)
    _requeue(job)
    _run(job, 2)
    again = merge_job(job, out)  # no overwrite: merge.json proves the file at the path is this job's
    rows = {entry.shard_id: entry.rows for entry in load_manifest(job).shards}
    expected = [v for shard, n in rows.items() for v in [2 if shard == SHARD else 1] * n]
    assert again.written and [json.loads(line)["version"] for line in out.open()] == expected

    edited = out.read_text() + '{"added": "by hand"}\n'
    out.write_text(edited)
    _requeue(job)
    _run(job, 3)
    with pytest.raises(OutputExistsError) as info:
        merge_job(job, out)
    assert str(out) in str(info.value) and "overwrite" in info.value.hint
    assert out.read_text() == edited, "an export edited since the job wrote it is left alone"
    assert merge_job(job, out, overwrite=True).written


def test_the_latest_accepted_code_is_the_jobs_and_a_damaged_record_is_an_error(job, monkeypatch):
    layout = JobLayout(job)
    prepared = {"operators": {"m": {"ops": "a"}}, "versions": {"ray": "1"}}
    assert job_code(layout, prepared) == prepared
    first = record_change(layout, {**prepared, "operators": {"m": {"ops": "b"}}}, [SHARD], ["m"])
    second = record_change(layout, {**prepared, "operators": {"m": {"ops": "c"}}}, [SHARD], ["m"])
    assert (first.seq, second.seq) == (1, 2) and second.shards == [SHARD]
    assert job_code(layout, prepared)["operators"] == {"m": {"ops": "c"}}
    # a listing that lags (NFS) still finds the latest: the names after it are opened
    monkeypatch.setattr(fsio, "list_names", lambda path: ["000001.json"])
    assert latest_change(layout).seq == 2
    monkeypatch.undo()

    # two retries at once: the second to publish the same sequence number is refused
    monkeypatch.setattr(retry, "latest_change", lambda _layout: first)
    with pytest.raises(JobDirError, match="another retry"):
        record_change(layout, prepared, [SHARD], ["m"])
    monkeypatch.undo()

    path = change_path(layout, 2)
    data = path.read_bytes()
    path.unlink()  # published by link(): replaced, never edited in place
    path.write_bytes(data.replace(b'"c"', b'"d"'))
    with pytest.raises(JobDirError) as info:
        job_code(layout, prepared)
    assert "checksum mismatch" in str(info.value) and str(path) in str(info.value)
    assert "prepare a new job_dir" in info.value.hint


def _code(ops: str) -> dict:
    return {"operators": {"m": {"ops": ops}}, "custom_operator_paths": {}, "versions": {"ray": "1"}}


def test_retry_refuses_a_code_change_before_anything_moves_and_accepts_it_only_with_the_rest_done(
    job, tmp_path, monkeypatch
):
    """``integration.retry_command.retry`` (what ``dj-elastic retry`` runs) with the code fingerprints
    faked: the real fingerprint and commands are tests/e2e/test_quarantine.py's."""
    from data_juicer_elastic.errors import CodeMismatchError, ConfigError
    from data_juicer_elastic.integration import retry_command

    out = tmp_path / "merged.jsonl"
    _run(job, 1)
    merge_job(job, out)
    monkeypatch.setattr(retry_command, "job_code", lambda layout, prepared: _code("job's"))
    monkeypatch.setattr(retry_command, "code_fingerprint", lambda recipe: _code("fixed"))
    result = json.loads((job / "done" / f"{SHARD}.json").read_text())
    (job / result["output"]).unlink()  # the shard is requeued by --shard-id
    done = sorted(p.name for p in (job / "done").iterdir())

    with pytest.raises(CodeMismatchError) as info:
        retry_command.retry(job, shard_ids=[SHARD])
    assert "operators.m is {ops: fixed} here, {ops: job's} in the job" in str(info.value)
    assert f"--shard-id {SHARD} --accept-code-change" in info.value.hint
    assert sorted(p.name for p in (job / "done").iterdir()) == done and not (job / "code-changes").exists()

    other = "part-00002-of-00004"
    (job / "done" / f"{other}.json").rename(tmp_path / "aside.json")  # a shard not done and not requeued
    with pytest.raises(ConfigError, match=f"neither done nor requeued \\({other}\\)"):
        retry_command.retry(job, shard_ids=[SHARD], accept_code_change=True)
    assert (job / "done" / f"{SHARD}.json").exists() and not (job / "code-changes").exists()
    (tmp_path / "aside.json").rename(job / "done" / f"{other}.json")

    outcome = retry_command.retry(job, shard_ids=[SHARD], accept_code_change=True)
    assert outcome.requeued == [SHARD] and not (job / "done" / f"{SHARD}.json").exists()
    monkeypatch.undo()
    record = latest_change(JobLayout(job))
    assert record.shards == [SHARD] and record.code["operators"] == {"m": {"ops": "fixed"}}
    lines = retry_command.next_steps(job, outcome)
    assert f"next: dj-elastic worker --job-dir {job} && dj-elastic merge --job-dir {job} --output {out}" in lines

    out.write_text("edited\n")  # the next merge could not replace it: the commands say so
    lines = retry_command.next_steps(job, outcome)
    assert lines[-3].endswith(f"--output {out} --overwrite") and "changed since this job wrote it" in lines[-1]
