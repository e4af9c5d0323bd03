"""Quarantine through the real commands: an operator that raises on 3 rows of a batch of 512 loses exactly
those 3 under elastic_sharded (each in `<export>_errors.jsonl` with its input row and error), where
Data-Juicer's default executor drops all 512; a Filter in Ray actor mode (warm actors) does the same;
the count is in the summary, `status` and merge.json.  Then the user's story after a fix of the mapper's
code (and of the filter's input list): the retry the summary names refuses the changed code up front
(nothing requeued), its `--accept-code-change` requeues the one shard with quarantined rows, status and
the report agree that it is not done, and the plain `dj-process` command again runs only that shard and
replaces the export the job wrote: exactly the output of a run that never failed."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import OPS_DIR, RAY_CPUS, read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

ROWS, BATCH = 1024, 512
MAPPER_FAILS, FILTER_FAILS = [7, 300, 301], [200]  # all in the first of 2 shards: the second has none


def write_input(path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(ROWS):
            handle.write(json.dumps({"id": i, "text": f"row {i} ünï", "score": i / 7, "big": 2**60 + i}) + "\n")
    return path


def recipe(
    tmp: Path, name: str, data: Path, executor: str, mapper_ids: Path, filter_ids: Path | None, ops: Path
) -> Path:
    """The failing Mapper, then (unless ``filter_ids`` is None) the failing Filter in Ray actor mode."""
    process = [{"e2e_fail_ids_mapper": {"fail_ids_path": str(mapper_ids), "batch_size": BATCH}}]
    if filter_ids is not None:
        process.append({"e2e_fail_ids_filter": {"fail_ids_path": str(filter_ids), "ray_execution_mode": "actor"}})
    fields = {
        "project_name": f"quarantine-{name}",
        "dataset_path": str(data),
        "export_path": str(tmp / name / "merged.jsonl"),
        "np": 1,
        "custom_operator_paths": [str(ops)],  # the user's own module, fixed below
        "process": process,
    }
    if executor == "elastic_sharded":
        fields["executor_type"] = executor
        fields["elastic"] = {"job_dir": str(tmp / name / "job"), "num_shards": 2, "ray_num_cpus": RAY_CPUS}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(fields, sort_keys=False))
    return path


def dj(*args, tmp: Path, rc: int = 0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_JOB")}
    proc = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == rc, f"{args}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return proc


def ids(path: Path) -> list[int]:
    return [row["id"] for row in read_jsonl(path)]


@pytest.mark.extended  # four dj-process runs (two default-executor oracles) and a bisection: a large case
def test_three_failing_rows_of_a_batch_of_512_are_quarantined_and_retried(tmp_path):
    data = write_input(tmp_path / "input.jsonl")
    none, mapper_ids, filter_ids = (tmp_path / n for n in ("none.txt", "mapper.txt", "filter.txt"))
    none.write_text("")
    mapper_ids.write_text("".join(f"{i}\n" for i in MAPPER_FAILS))
    filter_ids.write_text("".join(f"{i}\n" for i in FILTER_FAILS))
    ops = tmp_path / "ops" / "e2e_ops.py"
    ops.parent.mkdir()
    shutil.copy(OPS_DIR / "e2e_ops.py", ops)

    # The oracle: Data-Juicer's default executor, nothing failing; then with the mapper failing.
    dj("dj-process", "--config", recipe(tmp_path, "clean", data, "default", none, none, ops), tmp=tmp_path)
    clean = read_jsonl(tmp_path / "clean" / "merged.jsonl")
    dj("dj-process", "--config", recipe(tmp_path, "dropped", data, "default", mapper_ids, none, ops), tmp=tmp_path)
    dropped = ids(tmp_path / "dropped" / "merged.jsonl")
    assert dropped == [row["id"] for row in clean if row["id"] >= BATCH], "Data-Juicer drops the whole batch"

    config = recipe(tmp_path, "elastic", data, "elastic_sharded", mapper_ids, filter_ids, ops)
    proc = dj("dj-process", "--config", config, tmp=tmp_path)
    export = tmp_path / "elastic" / "merged.jsonl"
    failed = set(MAPPER_FAILS + FILTER_FAILS)
    assert read_jsonl(export) == [row for row in clean if row["id"] not in failed], "every other row, in order"

    errors = export.with_name("merged_errors.jsonl")
    lines = errors.read_bytes().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["row_number"] for r in records] == sorted(failed)
    source = data.read_bytes().splitlines()
    assert [line[line.index(b',"row":') + 7 : -1] for line in lines] == [source[i] for i in sorted(failed)]
    mapper, filter_ = ("e2e_fail_ids_mapper", 0, "ValueError"), ("e2e_fail_ids_filter", 1, "KeyError")
    assert [(r["op"], r["op_index"], r["error_type"]) for r in records] == [mapper, filter_, mapper, mapper]
    assert records[0]["error"] == "e2e_fail_ids_mapper: cannot process id 7"

    console = proc.stdout + proc.stderr
    assert "4 rows quarantined" in console and "merged_errors.jsonl" in console, console[-3000:]
    job = tmp_path / "elastic" / "job"
    # --all: the done markers are read (from the job summary alone quarantined rows are not known)
    status = json.loads(dj("dj-elastic", "status", "--job-dir", job, "--json", "--all", tmp=tmp_path).stdout)
    assert status["quarantined_rows"] == 4
    assert json.loads((job / "merge.json").read_text())["errors_rows"] == 4
    verified = dj("dj-elastic", "verify", "--job-dir", job, tmp=tmp_path).stdout
    # the output, the filter's row stats and the quarantine file, each re-hashed
    assert f"(file: {len(read_jsonl(export))} rows" in verified and "3 file(s) re-hashed" in verified, verified

    # The fix: the mapper's code (the user's module) and the filter's input list.
    first, second = sorted(p.stem for p in (job / "done").glob("*.json"))
    accepted_second = (job / "done" / f"{second}.json").read_bytes()
    code = ops.read_text()
    fixed = code.replace(
        "        if bad:\n            raise ValueError", "        if False:  # fixed\n            raise ValueError"
    )
    assert fixed != code
    ops.write_text(fixed)
    filter_ids.write_text("")

    # The command the summary names refuses the changed code before anything moves.
    hint = next(line for line in console.splitlines() if "merged_errors.jsonl (" in line)
    command = re.search(r"dj-elastic retry --job-dir \S+ --quarantined", hint)
    assert command is not None, hint
    refused = dj(*shlex.split(command.group()), tmp=tmp_path, rc=2)
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("error: operator code:") and "e2e_fail_ids_mapper" in line and str(ops) in line, line
    assert f"{command.group()} --accept-code-change;" in line, line
    assert sorted(p.stem for p in (job / "done").glob("*.json")) == [first, second], "nothing requeued"

    retried = dj(*shlex.split(command.group()), "--accept-code-change", tmp=tmp_path)
    assert f"requeued 1 shard(s): {first}" in retried.stdout, retried.stdout
    job_arg = shlex.quote(os.path.relpath(job, tmp_path))
    merge = f"dj-elastic merge --job-dir {job_arg} --output {shlex.quote(os.path.relpath(export, tmp_path))}"
    assert f"next: dj-elastic worker --job-dir {job_arg} && {merge}" in retried.stdout, retried.stdout
    assert "dj-process --config" in retried.stdout, retried.stdout

    # status (from the job summary, and every record) and the report agree: the requeued shard is not done
    manifest = json.loads((job / "manifest.json").read_text())
    second_first_row = next(e["first_row"] for e in manifest["shards"] if e["shard_id"] == second)
    second_rows = [row for row in clean if row["id"] >= second_first_row]  # the input's ids are its row numbers
    for flags in ([], ["--all"]):
        status = json.loads(dj("dj-elastic", "status", "--job-dir", job, "--json", *flags, tmp=tmp_path, rc=1).stdout)
        assert (status["counts"]["done"], status["counts"]["pending"]) == (1, 1), status["counts"]
        assert (status["output_rows"], status["quarantined_rows"]) == (len(second_rows), 0), flags
    dj("dj-elastic", "report", "--job-dir", job, "--output", tmp_path / "report.html", tmp=tmp_path)
    report = (tmp_path / "report.html").read_text()
    assert '<b class="">1 / 2</b>shards done' in report and '<b class="">0</b>rows quarantined' in report

    # The plain command again: only the requeued shard runs, and the job's own export is replaced.
    dj("dj-process", "--config", config, tmp=tmp_path)
    assert read_jsonl(export) == clean, "exactly once, in input order: a run that never failed"
    assert not errors.exists() and json.loads((job / "merge.json").read_text())["errors_rows"] == 0
    assert (job / "done" / f"{second}.json").read_bytes() == accepted_second, "the other shard did not run again"
    assert len(list((job / "attempts" / second).iterdir())) == 1
    status = json.loads(dj("dj-elastic", "status", "--job-dir", job, "--json", tmp=tmp_path).stdout)
    assert status["complete"] and (status["output_rows"], status["quarantined_rows"]) == (len(clean), 0)
