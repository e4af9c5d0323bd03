"""Matrix row 1: a worker SIGKILLs itself at every named crash point; a re-run completes the job
with one accepted result per shard and rows out = rows in.

Fast form: the worker driver (real worker loop and lease code, fake runner) in subprocesses.
Real form: `dj-elastic worker` and `dj-elastic merge` with real Ray, killed at `done` and `merge`.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time

import pytest
import yaml

from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.task_queue import read_lease

from .conftest import driver_env, run_driver, summary_of
from .fakes import done_shards, merged_ids, prepare, write_input

ROWS, SHARDS = 40, 4
FIRST = "part-00000-of-00004"


def _assert_complete(job, tmp_path):
    done = done_shards(job)
    assert sorted(done) == [f"part-{i:05d}-of-00004" for i in range(SHARDS)]
    for shard, record in done.items():  # one accepted result each, written by the attempt it names
        assert (job / record["output"]).exists() and record["shard_id"] == shard
    out = tmp_path / "merged.jsonl"
    merged = run_driver("merge", job, out)
    assert merged.returncode == 0, merged.stderr
    assert merged_ids(out) == list(range(ROWS)), "rows out = rows in, in input order"


@pytest.mark.parametrize("point", ["claim", "write", "fsync", "done", "published"])
def test_worker_killed_at_a_crash_point_then_rerun_completes(tmp_path, point):
    job = prepare(tmp_path, ROWS, SHARDS)
    victim = run_driver("worker", job, node="victim", crash=point)
    assert victim.returncode == -signal.SIGKILL, victim.stderr[-2000:]
    assert len(done_shards(job)) == (1 if point == "published" else 0)

    rescuer = run_driver("worker", job, node="rescuer")
    assert rescuer.returncode == 0, rescuer.stderr[-2000:]
    _assert_complete(job, tmp_path)

    view = read_lease(JobLayout(job), FIRST)
    accepted = done_shards(job)[FIRST]
    if point == "published":
        # The victim's result was linked before it died: it stays the accepted one, nobody redoes it.
        assert view.generation == 1 and accepted["node_id"] == "victim"
        assert summary_of(rescuer)["claimed"] == SHARDS - 1
    else:
        # The victim's claim (same host, pid gone) is taken over at once under generation 2.
        assert view.generation == 2 and view.claim.takeover_reason == "dead-pid"
        assert accepted["node_id"] == "rescuer" and accepted["generation"] == 2
        failure = json.loads((job / "failures" / FIRST / "gen-000001.json").read_bytes())
        assert failure["exit_reason"] == "holder-dead" and failure["node_id"] == "victim"


@pytest.mark.parametrize("point", ["merge", "finalize"])
def test_merge_killed_mid_way_leaves_no_output_and_merging_again_completes(tmp_path, point):
    job = prepare(tmp_path, ROWS, SHARDS)
    assert run_driver("worker", job).returncode == 0
    out = tmp_path / "merged.jsonl"
    killed = run_driver("merge", job, out, crash=point)
    assert killed.returncode == -signal.SIGKILL
    assert not out.exists(), "a killed merge never leaves a partial file at the export path"
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".merged.jsonl.tmp-")]
    assert len(left) == 1, "the victim's temp file (SIGKILL skips every cleanup)"
    first = run_driver("merge", job, out)
    assert first.returncode == 0 and summary_of(first)["written"] is True
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".merged.jsonl.tmp-")], (
        "the next merge on this host removed the dead merger's temp file"
    )
    again = run_driver("merge", job, out)  # finalize twice: identical output counts as success
    assert again.returncode == 0 and summary_of(again) == {**summary_of(first), "written": False}
    assert merged_ids(out) == list(range(ROWS))


@pytest.mark.parametrize("point", ["merge@1", "merge@3", "finalize"])
def test_streaming_merge_killed_mid_way_resumes_to_the_identical_file(tmp_path, point):
    """The follower (merge --follow) dies after a shard's bytes reached the partial but before its
    progress record said so (torn tail), or before publishing; the next follower truncates what
    was not recorded and produces exactly the non-streaming merge."""
    job = prepare(tmp_path, ROWS, SHARDS)
    assert run_driver("worker", job).returncode == 0
    out = tmp_path / "streamed.jsonl"
    killed = run_driver("follow", job, out, crash=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not out.exists(), "nothing is published at the export path before the whole file is final"
    record = tmp_path / "streamed.jsonl.progress.json"  # none yet when the first shard was torn
    progress = json.loads(record.read_bytes()) if record.exists() else {"shards_final": 0, "bytes_final": 0}
    assert progress["shards_final"] == {"merge@1": 0, "merge@3": 2, "finalize": SHARDS}[point]
    assert (tmp_path / "streamed.jsonl.partial").stat().st_size >= progress["bytes_final"]
    resumed = run_driver("follow", job, out)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    plain = tmp_path / "plain.jsonl"
    assert run_driver("merge", job, plain).returncode == 0
    assert out.read_bytes() == plain.read_bytes() and merged_ids(out) == list(range(ROWS))
    assert not (tmp_path / "streamed.jsonl.partial").exists()


@pytest.mark.extended
@pytest.mark.e2e
@pytest.mark.ray
def test_real_worker_and_merge_killed_at_crash_points(tmp_path):
    """The real commands with real Ray: a worker dies right after its first claim, another right
    after its first done marker (before its pace record counts it), a merge dies mid-way;
    re-running completes, and `dj-elastic status` counts every result. (A worker claims only
    once its Ray runtime is up, so the victim starts Ray too; the real runner's own write/fsync
    points are tested without Ray below.)"""
    data = write_input(tmp_path / "input.jsonl", 40)
    job, out = tmp_path / "job", tmp_path / "merged.jsonl"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "project_name": "faults",
                "np": 1,
                "executor_type": "elastic_sharded",
                "dataset_path": str(data),
                "export_path": str(out),
                "elastic": {"job_dir": str(job), "num_shards": 2, "ray_num_cpus": 1},
                "process": [{"whitespace_normalization_mapper": None}],
            }
        )
    )

    def cli(*args, crash=None, faults=None):
        env = driver_env(crash=crash, faults=faults)
        t0 = time.monotonic()
        proc = subprocess.run(["dj-elastic", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        print(f"dj-elastic {args[0]} ({crash or 'no crash'}): {time.monotonic() - t0:.1f}s")  # shown with pytest -s
        return proc

    assert cli("prepare", "--config", str(recipe)).returncode == 0
    victim = cli("worker", "--job-dir", str(job), crash="claim")
    assert victim.returncode == -signal.SIGKILL, victim.stderr[-3000:]
    (held,) = [p.relative_to(job / "claims").as_posix() for p in (job / "claims").rglob("gen-*")]
    shard = held.split("/")[0]  # fresh workers start at a random shard
    # Row 13 through the real command: an unwritable job dir is one exit-2 line, nothing claimed.
    denied = cli("worker", "--job-dir", str(job), faults=[{"op": "create", "errno": "EACCES", "times": None}])
    assert denied.returncode == 2 and "Traceback" not in denied.stderr, denied.stderr[-3000:]
    assert "Permission denied" in denied.stderr.strip().splitlines()[-1]
    claims = sorted(p.relative_to(job / "claims").as_posix() for p in (job / "claims").rglob("gen-*"))
    assert claims == [f"{shard}/gen-000001.json"], "nothing claimed, nothing recorded"
    # The rescuer dies right after linking its first result, before its pace record counts it
    rescuer = cli("worker", "--job-dir", str(job), crash="published")
    assert rescuer.returncode == -signal.SIGKILL, rescuer.stderr[-3000:]
    rescued = cli("worker", "--job-dir", str(job))
    assert rescued.returncode == 0, rescued.stderr[-3000:]
    records = {p.stem: json.loads(p.read_bytes()) for p in (job / "done").iterdir()}
    assert len(records) == 2 and records[shard]["generation"] >= 2  # taken over (twice if held ahead)
    killed = cli("merge", "--job-dir", str(job), "--output", str(out), crash="merge")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not out.exists()
    merged = cli("merge", "--job-dir", str(job), "--output", str(out))
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert [json.loads(line)["id"] for line in out.open()] == list(range(40)), "rows out = rows in, in order"

    # `dj-elastic status` after it all: every done shard in a node's row, every output row counted
    status = cli("status", "--job-dir", str(job), "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    data = json.loads(status.stdout)
    assert data["complete"] and data["output_rows"] == 40 and data["counts"]["done"] == 2, data
    nodes = {n["node_id"]: n for n in data["nodes"]}
    assert sum(n["shards_done"] for n in nodes.values()) == 2, (data["source"], nodes)
    for node in {r["node_id"] for r in records.values()}:
        mine = [r for r in records.values() if r["node_id"] == node]
        assert (nodes[node]["shards_done"], nodes[node]["output_rows"]) == (len(mine), sum(r["rows"] for r in mine))
    assert "40/40 input rows done, 40 output rows" in cli("status", "--job-dir", str(job)).stdout


@pytest.mark.parametrize("op", ["write", "fsync"])
def test_the_ray_runners_own_output_write_reaches_the_seam(tmp_path, op):
    """execution.row_writer writes the shard output with plain open(): its write and fsync
    are seam points too, so `write`/`fsync` crash points and faults reach the real runner."""
    import pyarrow as pa

    from data_juicer_elastic.execution.row_writer import ExportLayout, write_shard
    from data_juicer_elastic.execution.shard_reader import InputRows
    from data_juicer_elastic.rows.shard_source import ShardSource, SourceSpan

    from .crashpoints import FaultRule, injected

    output = tmp_path / "attempt" / "output.jsonl"
    output.parent.mkdir()
    shard = tmp_path / "shard.jsonl"
    shard.write_text('{"id": 0}\n{"id": 1}\n')
    content = shard.read_bytes()
    stat = shard.stat()
    span = SourceSpan(str(shard), 0, len(content), "none", stat.st_size, stat.st_mtime_ns, 2)
    source = ShardSource("part-00000-of-00001", (span,), len(content), hashlib.sha256(content).hexdigest(), 0)
    batch = pa.table({"id": [0, 1]})

    def write():
        inputs = InputRows(source)
        try:
            return write_shard([batch], ["id"], inputs, output, output.with_name("s.jsonl"), ExportLayout())
        finally:
            inputs.close()

    with injected(FaultRule(op, "ENOSPC", path="output.jsonl")) as plan, pytest.raises(OSError):
        write()
    assert plan.injected and not list(output.parent.iterdir()), "nothing is left behind"
    assert write().output.rows == 2
