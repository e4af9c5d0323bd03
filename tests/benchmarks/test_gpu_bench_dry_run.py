"""The real-GPU adaptive-batching benchmark's --cpu-dry-run: every contender's code path on a tiny CPU model
with forced OOMs (the GPU run itself needs a CUDA machine: see benchmarks/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("data_juicer")

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "gpu" / "bench.py"


def run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, str(BENCH), "--cpu-dry-run", "--json", str(out), "--workdir", str(tmp_path), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.mark.extended  # 15-50 s of CPU model runs: a benchmark's smoke test, like the other benchmarks' ones
def test_contenders_dry_run(tmp_path):
    contenders = [
        "fixed-128-skip",
        "fixed-128-raise",
        "fixed-best",
        "data-juicer-1.6.1",
        "ours-default",
        "ours-tokens-unsorted",
    ]
    # 256 rows (two outer batches): every contender's path, at half the dry run's default cost
    proc, result = run(tmp_path, "--no-sharded", "--rows", "256", "--contenders", *contenders)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = {r["name"].split(" (")[0]: r for r in result["contenders"]}
    assert sorted(got) == sorted(contenders)
    # Data-Juicer without adaptive batching: skip_op_error drops whole batches and "succeeds"; without it, fails
    assert got["fixed-128-skip"]["rows_out"] < 256 and got["fixed-128-skip"]["ooms"] > 0
    assert got["fixed-128-raise"]["failed"] and got["fixed-128-raise"]["rows_out"] == 0
    # the search ends at a size that ran every row without an OOM
    assert got["fixed-best"]["ooms"] == 0 and got["fixed-best"]["rows_out"] == 256
    for name in ("data-juicer-1.6.1", "ours-default", "ours-tokens-unsorted"):
        r = got[name]
        assert r["ooms"] > 0, name  # the forced OOMs happened and were recovered
        assert (r["rows_out"], r["lost"], r["duplicated"], r["reordered"], r["changed"]) == (256, 0, 0, 0, 0), name
        assert r["max_diff"] < 1e-3, name  # every embedding matches the 8-row reference
    assert "sorted outer batches 2" in got["ours-default"]["note"]  # the default sorts by cost
    assert "sorted outer batches 0" in got["ours-tokens-unsorted"]["note"]
