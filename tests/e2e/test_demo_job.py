"""The demo job through the real `dj-process`: equal to the plain `ray` executor, in input order,
resumable, and analysable with `dj-analyze`."""

from __future__ import annotations

import collections
import json

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


def test_dj_analyze_works_on_the_merged_output(demo_run):
    tmp, recipe = demo_run
    merged = tmp / "job" / "merged.jsonl"
    proc = run(["dj-analyze", "--config", str(recipe), "--dataset_path", str(merged)], cwd=tmp)
    assert_ok(proc)
    overall = list((tmp / "job").rglob("overall.csv"))
    assert overall, f"dj-analyze wrote no overall.csv:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


def test_status_reports_a_complete_job(demo_run):
    tmp, _ = demo_run
    proc = run(["dj-elastic", "status", "--job-dir", str(tmp / "job" / "job"), "--json"], cwd=tmp)
    assert_ok(proc)
    status = json.loads(proc.stdout)
    assert status["complete"] is True


def test_bundled_demo_recipe_runs_as_in_the_readme(tmp_path):
    """`dj-process --config recipes/demo.yaml` from a checkout, exactly as the README says."""
    import shutil

    for rel in ("recipes/demo.yaml", "demos/data/demo.jsonl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    proc = run(["dj-process", "--config", "recipes/demo.yaml", "--elastic.ray_num_cpus", "1"], cwd=tmp_path)
    assert_ok(proc)
    merged = read_jsonl(tmp_path / "outputs" / "demo" / "merged.jsonl")
    source = read_jsonl(tmp_path / "demos" / "data" / "demo.jsonl")
    assert 0 < len(merged) < len(source)
    assert len(list((tmp_path / "outputs" / "demo" / "job" / "done").iterdir())) == 8
