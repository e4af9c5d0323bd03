"""The real commands (``dj-elastic``, ``dj-process``) in subprocesses, for the fault matrix's
second round: each defect is checked through what a user runs.

Jobs are set up in-process with the fake runner (``fakes``) where the defect is not in
the runner: the commands under test then see an ordinary finished or half-finished job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.sharedfs.identity import WorkerIdentity

from .conftest import REPO
from .crashpoints import hooked_pythonpath
from .fakes import LEASE, fsio_runner, prepare, write_input

SHARD0 = "part-00000-of-00004"


def env(extra: dict | None = None) -> dict:
    """The test's environment with this checkout first on the path (subprocesses, Ray workers),
    behind the hook that installs a fault plan ``extra`` names (:func:`faults`)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJ_ELASTIC_TEST_", "RAY_", "DJ_PROCESS_"))}
    base["PYTHONPATH"] = hooked_pythonpath(os.environ.get("PYTHONPATH"))
    base.update(extra or {})
    return base


def dj_elastic(*args: str, extra_env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", *map(str, args)],
        cwd=REPO,
        env=env(extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dj_process_argv(recipe: Path) -> list[str]:
    """``dj-process --config <recipe>``: this environment's script, else the one on the PATH."""
    script = str(Path(sys.executable).with_name("dj-process"))
    return [script if os.path.exists(script) else "dj-process", "--config", str(recipe)]


def dj_process(recipe: Path, extra_env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        dj_process_argv(recipe),
        cwd=recipe.parent,
        env=env(extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def faults(*rules: dict) -> dict:
    """The environment that installs a fault plan in the command (``crashpoints``, through :func:`env`)."""
    return {"DJ_ELASTIC_TEST_FAULTS": json.dumps(list(rules))}


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The command failed the way every expected failure must: exit 2, no traceback, and its
    last stderr line is the one error line (Data-Juicer may log before it)."""
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and "error: " in lines[-1], proc.stderr[-3000:]
    return lines[-1]


def release_reason(job: Path, shard: str, gen: int = 1) -> str | None:
    """The reason of the claim release record of ``shard``'s generation ``gen``; None if none."""
    path = job / "releases" / shard / f"gen-{gen:06d}.json"
    return json.loads(path.read_bytes())["reason"] if path.exists() else None


def finished_job(tmp: Path, rows: int = 40, shards: int = 4) -> Path:
    """A prepared job whose shards were all run (fake runner: each row copied, tagged)."""
    job = prepare(tmp, rows=rows, shards=shards)
    run_worker(
        job, WorkerIdentity.current(), fsio_runner(), WorkerSettings(max_retries=0, wait_for_completion=False, **LEASE)
    )
    return job


def tree(path: Path) -> dict[str, bytes | str]:
    """Every entry under ``path``: file bytes, link targets, directories (to compare before/after)."""
    out: dict[str, bytes | str] = {}
    for p in sorted(path.rglob("*")):
        key = str(p.relative_to(path))
        out[key] = f"-> {os.readlink(p)}" if p.is_symlink() else "<dir>" if p.is_dir() else p.read_bytes()
    return out


def recipe(tmp: Path, data: Path, job: Path, *, export: Path, name: str = "recipe.yaml", **fields) -> Path:
    """A dj-process recipe for an elastic job (Data-Juicer's demo operators, one Ray CPU)."""
    body = {
        "project_name": "faults",
        "executor_type": "elastic_sharded",
        "dataset_path": str(data),
        "export_path": str(export),
        "np": 1,
        "process": [{"whitespace_normalization_mapper": None}],
        "elastic": {"job_dir": str(job), "num_shards": 2, "ray_num_cpus": 1},
    }
    elastic = fields.pop("elastic", {})
    body["elastic"].update(elastic)
    body.update(fields)
    path = tmp / name
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return path


def small_input(tmp: Path, rows: int = 12) -> Path:
    return write_input(tmp / "input.jsonl", rows)


E2E_OPS = REPO / "tests" / "e2e" / "ops" / "e2e_ops.py"


def slow_job(tmp: Path, rows: int, seconds_per_row: float, ops: Path = E2E_OPS, **elastic) -> Path:
    """A prepared job (``dj-elastic prepare``) whose one operator sleeps per row (real Ray runs it)."""
    data = write_input(tmp / "input.jsonl", rows)
    job = tmp / "job"
    path = recipe(
        tmp,
        data,
        job,
        export=tmp / "out" / "merged.jsonl",
        process=[{"e2e_sleep_mapper": {"seconds_per_row": seconds_per_row}}],
        custom_operator_paths=[str(ops)],
        elastic=elastic,
    )
    proc = dj_elastic("prepare", "--config", path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return job


def merged_rows(job: Path, output: Path) -> list[dict]:
    """``dj-elastic merge`` of a finished job: its rows."""
    proc = dj_elastic("merge", "--job-dir", job, "--output", output)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in output.read_text().splitlines()]
