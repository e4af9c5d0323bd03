"""`dj-elastic report` on a real job run by the real `dj-process` (one shard retried, one shard running
while the first report is taken, one shard failed terminally, adaptive batching recovering OOMs),
rendered in headless Chromium: no console errors, no network request, the charts are there."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import RAY_CPUS, assert_ok, run, write_recipe
from tests.report import browser

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

REPORT_OPS = Path(__file__).resolve().parent / "report_ops.py"
ROWS, SHARDS = 150, 3  # 50 rows per shard: ids 0-49, 50-99, 100-149
SLOW_SHARD, RETRIED_SHARD, FAILED_SHARD = "part-00000-of-00003", "part-00001-of-00003", "part-00002-of-00003"


def needs_chromium() -> None:
    if browser.find_chromium() is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium chromium-driver; .ci/run does this)")


def _tree(job: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(job)): (p.stat().st_size, p.stat().st_mtime_ns) for p in job.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    """Run the job once; take a report while the slow shard runs and one after the job has failed."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demos"))
    from generate_data import write_dataset

    tmp = tmp_path_factory.mktemp("report-e2e")
    data = write_dataset(tmp / "input.jsonl", rows=ROWS, seed=5)
    job = tmp / "job"
    scenario_op = {
        "report_scenario_mapper": {
            "flaky_id": 60,
            "flaky_marker": str(tmp / "flaky-marker"),
            "slow_ids": [0, 49],
            "seconds_per_row": 0.05,
            "fail_id": 110,
        }
    }
    oom_op = {
        "elastic_oom_demo_mapper": {
            "capacity": 600,
            "batch_size": 32,
            "torch_errors": False,
            "adaptive_batching": True,
        }
    }
    recipe = write_recipe(
        tmp / "recipe.yaml",
        executor_type="elastic_sharded",
        dataset_path=str(data),
        export_path=str(tmp / "merged.jsonl"),
        custom_operator_paths=[str(REPORT_OPS)],
        skip_op_error=False,
        process=[scenario_op, oom_op],
        elastic={"job_dir": str(job), "num_shards": SHARDS, "max_retries": 1, "ray_num_cpus": RAY_CPUS},
    )
    env = {**os.environ, "DJ_ELASTIC_NODE_ID": "report-node-a", "DJ_ELASTIC_RUN_ID": "report-e2e"}
    log = tmp / "dj-process.log"  # a file, not a pipe: nobody reads a pipe while we poll, and it would fill
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            ["dj-process", "--config", str(recipe)],
            cwd=tmp,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while not list((job / "attempts" / SLOW_SHARD).glob("*/attempt.json")):
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the slow shard never started"
            time.sleep(0.2)
        running = run(["dj-elastic", "report", "--job-dir", str(job), "--output", str(tmp / "running.html")], cwd=tmp)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 2, log.read_text()[-4000:]
    before = _tree(job)
    final = run(["dj-elastic", "report", "--job-dir", str(job), "--output", str(tmp / "out" / "final.html")], cwd=tmp)
    assert _tree(job) == before, "dj-elastic report must not change the job directory"
    return tmp, job, running, final


@pytest.mark.extended
def test_report_of_a_running_job_shows_the_running_shard(scenario):
    tmp, _, running, _ = scenario
    assert_ok(running)
    html = (tmp / "running.html").read_text()
    assert 'class="bar bar-running"' in html, "the slow shard was running when the report was taken"
    assert "running" in html and "now</text>" in html


@pytest.mark.extended
def test_report_of_the_failed_job_in_chromium(scenario):
    needs_chromium()
    tmp, job, _, final = scenario
    assert_ok(final)
    assert re.search(r"wrote .*final\.html \([\d,]+ bytes\): 3 shards, 5 attempts", final.stdout), final.stdout
    seen = browser.load(tmp / "out" / "final.html")
    assert seen.console_errors == []
    assert seen.requests == [], "the report must not load anything"
    dom = seen.dom
    assert dom["scripts"] == 0
    labels = [c["label"] for c in dom["charts"]]
    assert labels[:4] == [
        "timeline of attempts per node",
        "throughput over time",
        "input rows done over time",
        "shard size vs attempt duration",
    ]
    assert any(label.startswith("adaptive batching size trace of") for label in labels)
    assert all(c["width"] > 500 and c["height"] > 60 and c["elements"] > 0 for c in dom["charts"])
    bars = sorted(dom["bars"])
    # shard 0 done (slowly); shard 1 failed once then done; shard 2 failed twice (max_retries=1)
    assert bars == sorted(["bar bar-done", "bar bar-done-after-retry"] + ["bar bar-failed"] * 3)
    assert dom["points"] == 5 and dom["titles"] > 5
    assert dom["ooms"] > 0 and dom["traces"] > 0, "the adaptive-batching OOMs show in the size traces"
    text = dom["text"]
    assert "1 shard(s) FAILED" in text
    assert f"{FAILED_SHARD}\tfailed\t2" in text and "refusing row 110" in text
    assert f"{RETRIED_SHARD}\tdone\t2" in text
    assert "report-e2e" in text and "FAILED in work (" in text  # the run's outcome, as status says it
    for fact in ("recipe hash", "content sha256", "stage identity", "data_juicer", "report_scenario_mapper"):
        assert fact in text, fact
