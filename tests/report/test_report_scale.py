"""`dj-elastic report` on a job directory of 10,000 shards on 40 nodes (written by the real record
writers): the report stays bounded, draws activity strips instead of 10,000 bars, keeps every failure
visible, and renders in headless Chromium without errors.  Also: the browser check itself can fail."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.e2e.conftest import assert_ok, run
from tests.report import browser
from tests.report.synthetic_job import build_job
from tests.report.test_report_e2e import needs_chromium

SHARDS, NODES = 10_000, 40
MAX_REPORT_BYTES = 2_500_000


@pytest.fixture(scope="module")
def big_job(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("big")
    with pytest.MonkeyPatch.context() as patch:
        # A fixture needs no durability: fsync of 10,000 shard files alone costs seconds on CI disks.
        patch.setattr(os, "fsync", lambda fd: None)
        return build_job(root, num_shards=SHARDS, nodes=NODES, failed=1, retried=2, running=1)


@pytest.fixture(scope="module")
def big_report(big_job) -> tuple[Path, str]:
    output = big_job.parent / "report" / "report.html"
    proc = run(["dj-elastic", "report", "--job-dir", str(big_job), "--output", str(output)], cwd=big_job.parent)
    assert_ok(proc)
    return output, proc.stdout


@pytest.mark.extended
@pytest.mark.slow
def test_report_of_10k_shards_is_bounded_and_aggregated(big_report):
    output, stdout = big_report
    assert re.search(r"10000 shards, 10003 attempts \(activity strips\)", stdout), stdout
    size = output.stat().st_size
    assert size < MAX_REPORT_BYTES, f"report is {size:,} bytes"
    html = output.read_text()
    assert html.count('class="strip"') > NODES  # every node has activity
    assert html.count("bar bar-failed") == 4 and html.count("bar bar-running") == 1  # each failure still marked
    assert "Showing 2," in html  # the scatter is sampled


@pytest.mark.extended
@pytest.mark.slow
def test_report_of_10k_shards_in_chromium(big_report):
    needs_chromium()
    output, _ = big_report
    seen = browser.load(output)
    assert seen.console_errors == [] and seen.requests == []
    dom = seen.dom
    assert [c["label"] for c in dom["charts"]] == [
        "timeline of attempts per node",
        "throughput over time",
        "input rows done over time",
        "shard size vs attempt duration",
    ]
    assert dom["strips"] > NODES and len(dom["bars"]) == 5 and 1000 < dom["points"] <= 3000
    tables = dict(dom["tables"])
    assert tables["nodes"] == NODES + 1 and tables["attention"] == 5  # header + failed, running, 2 retried
    assert "node-00" in dom["text"].split("Nodes (slowest first)")[1].split("\n")[2]  # the slow node first


def test_the_browser_check_catches_errors_and_network_requests(tmp_path):
    needs_chromium()
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><p>x</p><img src='http://192.0.2.1/pixel.png'>"
        "<script>console.error('broken chart')</script></body></html>"
    )
    seen = browser.load(page)
    assert any("broken chart" in e for e in seen.console_errors), seen.console_errors
    assert seen.requests == ["http://192.0.2.1/pixel.png"]
