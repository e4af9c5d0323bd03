"""The demo job through the real `dj-process`: equal to the plain `ray` executor, in input order,
resumable, and analysable with `dj-analyze`."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest

from .conftest import REPO, assert_ok, elastic_recipe, read_jsonl, read_ray_output, run, write_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

STATS = "__dj__stats__"


def _canonical(row: dict) -> str:
    return json.dumps({k: v for k, v in row.items() if k != STATS}, sort_keys=True, ensure_ascii=False)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, demo_input):
    tmp = tmp_path_factory.mktemp("demo")
    recipe = elastic_recipe(tmp, demo_input, num_shards=4)
    proc = run(["dj-process", "--config", str(recipe)], cwd=tmp)
    assert_ok(proc)
    return tmp, recipe


def test_merged_rows_equal_plain_ray_executor_in_input_order(demo_run, demo_input, tmp_path):
    tmp, _ = demo_run
    merged = read_jsonl(tmp / "job" / "merged.jsonl")
    plain_recipe = write_recipe(
        tmp_path / "plain.yaml",
        executor_type="ray",
        ray_address="local",
        dataset_path=str(demo_input),
        export_path=str(tmp_path / "plain" / "out.jsonl"),
    )
    assert_ok(run(["dj-process", "--config", str(plain_recipe)], cwd=tmp_path))
    plain = read_ray_output(tmp_path / "plain" / "out.jsonl")

    assert 0 < len(merged) < 600, "the demo recipe both keeps and filters rows"
    assert collections.Counter(map(_canonical, merged)) == collections.Counter(map(_canonical, plain))
    ids = [row["id"] for row in merged]
    assert ids == sorted(ids), "merged output must follow input order"
    assert all(STATS in row for row in merged), "Data-Juicer's per-row stats are kept for dj-analyze"


def test_rerun_after_success_is_a_no_op(demo_run):
    tmp, recipe = demo_run
    merged = tmp / "job" / "merged.jsonl"
    before = (merged.read_bytes(), merged.stat().st_mtime_ns)
    proc = run(["dj-process", "--config", str(recipe)], cwd=tmp)
    assert_ok(proc)
    assert (merged.read_bytes(), merged.stat().st_mtime_ns) == before


def test_dj_analyze_works_on_the_merged_output_without_installing_anything(demo_run):
    """On a fresh machine without torch, Data-Juicer's lazy loader would pip-install torch (a
    CUDA build of several GB) at the end of every Filter; analysis needs no torch at all."""
    tmp, recipe = demo_run
    merged = tmp / "job" / "merged.jsonl"
    installs = tmp / "installs.log"
    paths = [str(Path(__file__).parent / "no_torch"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {"PYTHONPATH": os.pathsep.join(paths), "DJ_ELASTIC_TEST_INSTALL_LOG": str(installs)}
    proc = run(["dj-analyze", "--config", str(recipe), "--dataset_path", str(merged)], cwd=tmp, env=env)
    assert_ok(proc)
    overall = list((tmp / "job").rglob("overall.csv"))
    assert overall, f"dj-analyze wrote no overall.csv:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert not installs.exists(), f"dj-analyze tried to install: {installs.read_text()}"


def test_status_reports_a_complete_job(demo_run):
    tmp, _ = demo_run
    proc = run(["dj-elastic", "status", "--job-dir", str(tmp / "job" / "job"), "--json"], cwd=tmp)
    assert_ok(proc)
    status = json.loads(proc.stdout)
    assert status["complete"] is True


@pytest.fixture(scope="module")
def bundled_demo(tmp_path_factory):
    """`dj-process --config recipes/demo.yaml` from a copy of the checkout, exactly as the README says."""
    import shutil

    tmp = tmp_path_factory.mktemp("bundled")
    for rel in ("recipes/demo.yaml", "recipes/demo_analyze.yaml", "demos/data/demo.jsonl"):
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp / rel)
    proc = run(["dj-process", "--config", "recipes/demo.yaml", "--elastic.ray_num_cpus", "1"], cwd=tmp)
    assert_ok(proc)
    return tmp


def test_bundled_demo_recipe_runs_as_in_the_readme(bundled_demo):
    merged = read_jsonl(bundled_demo / "outputs" / "demo" / "merged.jsonl")
    source = read_jsonl(bundled_demo / "demos" / "data" / "demo.jsonl")
    assert 0 < len(merged) < len(source)
    assert len(list((bundled_demo / "outputs" / "demo" / "job" / "done").iterdir())) == 8


def test_overall_stats_match_dj_analyze_on_the_merged_output(bundled_demo):
    """docs/analysis.md: `dj-analyze --config recipes/demo_analyze.yaml` on the merged output; its
    overall.csv equals the overall statistics finalize merged from the per-shard summaries."""
    import numpy as np
    import pandas as pd

    demo = bundled_demo / "outputs" / "demo"
    proc = run(["dj-analyze", "--config", "recipes/demo_analyze.yaml"], cwd=bundled_demo)
    assert_ok(proc)
    (analyzed,) = (demo / "analysis").glob("*/analysis/overall.csv")
    expected = pd.read_csv(analyzed, index_col=0)
    ours = pd.read_csv(demo / "merged_overall_stats.csv", index_col=0)
    assert (demo / "job" / "stats" / "overall.csv").read_text() == (demo / "merged_overall_stats.csv").read_text()
    body = json.loads((demo / "merged_overall_stats.json").read_text())
    assert body["rows"] == len(read_jsonl(demo / "merged.jsonl")) and body["summaries_recomputed"] == []

    assert list(ours.columns) == list(expected.columns) == ["text_len"]
    assert list(ours.index) == list(expected.index)
    quantiles = [label for label in ours.index if label.endswith("%")]
    pd.testing.assert_frame_equal(ours.drop(index=quantiles), expected.drop(index=quantiles), rtol=1e-12)
    values = np.sort([row[STATS]["text_len"] for row in read_jsonl(demo / "merged.jsonl")]).astype(float)
    for label in quantiles:  # the stated bound: within alpha of both sorted values pandas interpolates
        h = float(label[:-1]) / 100 * (len(values) - 1)
        lo, hi = values[int(np.floor(h))], values[int(np.ceil(h))]
        error = abs(ours.loc[label, "text_len"] - expected.loc[label, "text_len"])
        assert error <= body["quantile_relative_accuracy"] * max(abs(lo), abs(hi)), (label, error)
