"""Quarantine through the real commands: an operator that raises on 3 rows of a batch of 512 loses exactly
those 3 under elastic_sharded (each in `<export>_errors.jsonl` with its input row and error), where
Data-Juicer's default executor drops all 512; a Filter in Ray actor mode (warm actors) does the same;
the count is in the summary, `status` and merge.json; and after the operator is fixed,
`dj-elastic retry --quarantined` plus a run again gives exactly the output of a run that never failed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import OPS_DIR, RAY_CPUS, read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

ROWS, BATCH = 1024, 512
MAPPER_FAILS, FILTER_FAILS = [7, 300, 301], [600]


def write_input(path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(ROWS):
            handle.write(json.dumps({"id": i, "text": f"row {i} ünï", "score": i / 7, "big": 2**60 + i}) + "\n")
    return path


def recipe(tmp: Path, name: str, data: Path, executor: str, mapper_ids: Path, filter_ids: Path | None) -> Path:
    """The failing Mapper, then (unless ``filter_ids`` is None) the failing Filter in Ray actor mode."""
    process = [{"e2e_fail_ids_mapper": {"fail_ids_path": str(mapper_ids), "batch_size": BATCH}}]
    if filter_ids is not None:
        process.append({"e2e_fail_ids_filter": {"fail_ids_path": str(filter_ids), "ray_execution_mode": "actor"}})
    fields = {
        "project_name": f"quarantine-{name}",
        "dataset_path": str(data),
        "export_path": str(tmp / name / "merged.jsonl"),
        "np": 1,
        "custom_operator_paths": [str(OPS_DIR / "e2e_ops.py")],
        "process": process,
    }
    if executor == "elastic_sharded":
        fields["executor_type"] = executor
        fields["elastic"] = {"job_dir": str(tmp / name / "job"), "num_shards": 2, "ray_num_cpus": RAY_CPUS}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(fields, sort_keys=False))
    return path


def dj(*args, tmp: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_JOB")}
    proc = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return proc


def ids(path: Path) -> list[int]:
    return [row["id"] for row in read_jsonl(path)]


def test_three_failing_rows_of_a_batch_of_512_are_quarantined_and_retried(tmp_path):
    data = write_input(tmp_path / "input.jsonl")
    none, mapper_ids, filter_ids = (tmp_path / n for n in ("none.txt", "mapper.txt", "filter.txt"))
    none.write_text("")
    mapper_ids.write_text("".join(f"{i}\n" for i in MAPPER_FAILS))
    filter_ids.write_text("".join(f"{i}\n" for i in FILTER_FAILS))

    # The oracle: Data-Juicer's default executor, nothing failing; then with the mapper failing.
    dj("dj-process", "--config", recipe(tmp_path, "clean", data, "default", none, none), tmp=tmp_path)
    clean = read_jsonl(tmp_path / "clean" / "merged.jsonl")
    dj("dj-process", "--config", recipe(tmp_path, "dropped", data, "default", mapper_ids, none), tmp=tmp_path)
    dropped = ids(tmp_path / "dropped" / "merged.jsonl")
    assert dropped == [row["id"] for row in clean if row["id"] >= BATCH], "Data-Juicer drops the whole batch"

    config = recipe(tmp_path, "elastic", data, "elastic_sharded", mapper_ids, filter_ids)
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
    assert [(r["op"], r["op_index"], r["error_type"]) for r in records] == [
        ("e2e_fail_ids_mapper", 0, "ValueError")
    ] * 3 + [("e2e_fail_ids_filter", 1, "KeyError")]
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

    # The fix (the operators' code unchanged: their input lists), then the quarantined shards again, whole.
    mapper_ids.write_text("")
    filter_ids.write_text("")
    retried = dj("dj-elastic", "retry", "--job-dir", job, "--quarantined", tmp=tmp_path)
    assert "requeued 2 shard(s)" in retried.stdout
    dj("dj-process", "--config", config, "--elastic.overwrite_output", "true", tmp=tmp_path)
    assert read_jsonl(export) == clean, "exactly once, in input order: a run that never failed"
    assert not errors.exists() and json.loads((job / "merge.json").read_text())["errors_rows"] == 0
