"""Progress of long local steps: prepare and merge report through shards.steps (shown by
data_juicer_elastic.console, tested in tests/console)."""

from __future__ import annotations

from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.shards import steps
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.prepare import prepare_job

from .conftest import copy_runner, identity, make_rows, request, write_rows


def test_scans_and_merge_report_until_done_equals_total(tmp_path):
    data = write_rows(tmp_path / "in.jsonl", make_rows(50))
    reports: list[tuple[str, int, int | None]] = []
    with steps.reporting(lambda *r: reports.append(r)):
        prepare_job(request(tmp_path / "job", data, 4))
        run_worker(
            tmp_path / "job",
            identity(),
            copy_runner(),
            WorkerSettings(ttl_secs=60, heartbeat_secs=10, max_retries=0, poll_interval_secs=0.1),
        )
        merge_job(tmp_path / "job", tmp_path / "out.jsonl")
    size = data.stat().st_size
    by_step: dict[str, list[tuple[int, int | None]]] = {}
    for step, done, total in reports:
        by_step.setdefault(step, []).append((done, total))
    assert list(by_step) == ["scanning shards", "merge"]
    assert by_step["scanning shards"][-1] == (size, size)  # planning reads no data: the scans read it all once
    merged = (tmp_path / "out.jsonl").stat().st_size
    assert by_step["merge"][-1] == (merged, merged) and len(by_step["merge"]) == 4, "one report per shard"
    assert all(d <= t for d, t in sum(by_step.values(), []))
    steps.report("ignored", 1, 1)  # no callback installed: nothing happens
