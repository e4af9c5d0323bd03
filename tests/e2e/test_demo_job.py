"""The demo job through the real `dj-process`: equal to the plain `ray` executor, in input order,
resumable, and analysable with `dj-analyze`."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import zlib
from pathlib import Path

import pytest

from tests.pty_run import redraws, run_on_terminal, scrolled_lines

from .conftest import REPO, assert_ok, elastic_recipe, read_jsonl, read_ray_output, run, write_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

STATS = "__dj__stats__"


def _canonical(row: dict) -> str:
    return json.dumps({k: v for k, v in row.items() if k != STATS}, sort_keys=True, ensure_ascii=False)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, demo_input):
    tmp = tmp_path_factory.mktemp("demo")
    recipe = elastic_recipe(tmp, demo_input, num_shards=4)
    proc = run(["dj-process", "--config", str(recipe)], cwd=tmp, env={"DJ_ELASTIC_VERBOSE": ""})
    assert_ok(proc)
    return tmp, recipe, proc


@pytest.mark.extended
def test_without_a_terminal_the_console_is_quiet_and_ends_with_a_summary(demo_run):
    """A scheduler's log file: the plugin's lines, warnings once, no configuration table, no
    per-shard Data-Juicer or Ray chatter, no redraws; everything else is in the log files."""
    tmp, _, proc = demo_run
    console = proc.stdout + proc.stderr
    lines = console.splitlines()
    assert "\r" not in console, "no live line when the console is not a terminal"
    assert "╒" not in console and "Configuration table" not in console
    assert "Loading dataset with Ray" not in console and "Connecting to existing Ray cluster" not in console
    assert console.count("Neither the required memory nor cpu") <= 1, "repeated per shard: folded into one line"
    # the job's progress: a plain line every 10 s while it moves (how many depends on the machine's speed)
    shown = [
        int(m.group(1).replace(",", "")) for line in lines if (m := re.search(r"progress: ([\d,]+)/600 rows", line))
    ]
    assert shown == sorted(shown), shown
    assert len([line for line in lines if "progress: " not in line]) <= 15, console
    assert any("planned" in line and "4 shards over 1 file(s)" in line for line in lines), console
    assert any("scanned" in line and "600 rows in 4 shards" in line for line in lines), console
    summary = next(i for i, line in enumerate(lines) if " done in " in line)
    assert "600 rows in" in lines[summary] and "4 shards, 0 retries" in lines[summary]
    assert any("output" in line and "merged.jsonl" in line for line in lines[summary:])
    assert any("dj-elastic report --job-dir" in line for line in lines[summary:])
    (node_log,) = (tmp / "job" / "job" / "logs").glob("*/*.log")
    assert "Loading dataset with Ray" in node_log.read_text(), "the log file keeps every line"


@pytest.mark.extended
def test_merged_rows_equal_plain_ray_executor_in_input_order(demo_run, demo_input, tmp_path):
    tmp, _, _ = demo_run
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
    # Data-Juicer's export layout: each row's stats beside the export, in row order (Ray keeps them inline)
    stats = read_jsonl(tmp / "job" / "merged_stats.jsonl")
    assert all(STATS not in row for row in merged) and len(stats) == len(merged)
    by_id = {row["id"]: row[STATS] for row in plain}
    assert [s[STATS] for s in stats] == [by_id[i] for i in ids]


@pytest.mark.extended
def test_rerun_after_success_is_a_no_op(demo_run):
    tmp, recipe, _ = demo_run
    merged = tmp / "job" / "merged.jsonl"
    before = (merged.read_bytes(), merged.stat().st_mtime_ns)
    proc = run(["dj-process", "--config", str(recipe)], cwd=tmp)
    assert_ok(proc)
    assert (merged.read_bytes(), merged.stat().st_mtime_ns) == before


@pytest.mark.extended
def test_dj_analyze_works_on_the_merged_output_without_installing_anything(demo_run):
    """On a fresh machine without torch, Data-Juicer's lazy loader would pip-install torch (a
    CUDA build of several GB) at the end of every Filter; analysis needs no torch at all."""
    tmp, recipe, _ = demo_run
    merged = tmp / "job" / "merged.jsonl"
    job_stats = (tmp / "job" / "merged_stats.jsonl").read_bytes()
    installs = tmp / "installs.log"
    analysis = tmp / "job" / "analysis" / "merged.jsonl"  # the way out the refusal names (docs/analysis.md)
    cmd = ["dj-analyze", "--config", str(recipe), "--dataset_path", str(merged), "--export_path", str(analysis)]
    proc = run(cmd, cwd=tmp, env=_without_torch(tmp))
    assert_ok(proc)
    overall = list((tmp / "job").rglob("overall.csv"))
    assert overall, f"dj-analyze wrote no overall.csv:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert not installs.exists(), f"dj-analyze tried to install: {installs.read_text()}"
    assert (tmp / "job" / "merged_stats.jsonl").read_bytes() == job_stats, "the job's row stats stay as merged"
    assert len(read_jsonl(analysis.with_name("merged_stats.jsonl"))) == len(read_jsonl(merged))


def _without_torch(tmp: Path) -> dict[str, str]:
    """A fresh machine's view: torch cannot be imported, and every lazy install is logged."""
    paths = [str(Path(__file__).parent / "no_torch"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths), "DJ_ELASTIC_TEST_INSTALL_LOG": str(tmp / "installs.log")}


@pytest.mark.extended
def test_status_reports_a_complete_job(demo_run):
    tmp, _, _ = demo_run
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
    # On a terminal, as a user runs it: the live progress line is drawn there.
    cmd = ["dj-process", "--config", "recipes/demo.yaml", "--elastic.ray_num_cpus", "1"]
    proc = run_on_terminal(cmd, cwd=tmp, env={"DJ_ELASTIC_VERBOSE": ""})
    assert_ok(proc)
    return tmp, proc.stdout


def test_bundled_demo_recipe_runs_as_in_the_readme(bundled_demo):
    tmp, _ = bundled_demo
    merged = read_jsonl(tmp / "outputs" / "demo" / "merged.jsonl")
    source = read_jsonl(tmp / "demos" / "data" / "demo.jsonl")
    assert 0 < len(merged) < len(source)
    assert len(list((tmp / "outputs" / "demo" / "job" / "done").iterdir())) == 8
    # Claim-ahead (on by default): one worker takes every shard after the first from the claim
    # made ahead, whose rows were read while the one before ran (jobdir.claiming).
    logs = sorted((tmp / "outputs" / "demo" / "job" / "attempts").glob("*/*/process.log"))
    read_ahead = [log for log in logs if "using the rows read ahead" in log.read_text()]
    assert (len(logs), len(read_ahead)) == (8, 7), [str(log) for log in read_ahead]


def test_on_a_terminal_progress_is_one_live_line_above_which_the_plugin_lines_scroll(bundled_demo):
    _, drawn = bundled_demo
    states = [state for state in redraws(drawn) if "/400" in state]
    assert len(states) >= 3, drawn[-3000:]
    assert all("rows" in state and "shards" in state and "/8 done" in state for state in states), states[-3:]
    assert any("rows/s" in state and "<" in state for state in states), "a rate and an ETA once rows move"
    assert states[0].startswith("0%") and "shards 8/8 done" in states[-1] and "400/400" in states[-1], states[-3:]
    lines = scrolled_lines(drawn)
    assert not any("/400 [" in line for line in lines), "the live line never scrolls"
    assert len(lines) <= 15 and "╒" not in drawn, lines
    assert any(" done in " in line and "400 rows in" in line and "8 shards" in line for line in lines), lines


def test_the_demo_console_shows_only_the_plugin_lines_and_names_each_wait(bundled_demo):
    """No Data-Juicer line (its plugin discovery, its num_cpus advice) between the plugin's own; while
    nothing is countable the live line says what it waits for, and it shows no ETA before a rate."""
    _, drawn = bundled_demo
    lines = scrolled_lines(drawn)
    plugin = ("planned ", "scanned ", "merged ", "done in ", "output ", "stats ", "report ", "logs ")
    shown = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in lines]  # without colours
    for text in filter(None, shown):
        assert re.match(r"\d\d:\d\d:\d\d ", text) and text[9:].strip().startswith(plugin), shown
    assert "Discovered" not in drawn and "num_cpus" not in drawn and "INFO" not in drawn
    states = [state for state in redraws(drawn) if "/400 [" in state]
    waiting = [state for state in states if " 0/400 [" in state]
    assert waiting and all(state.split("|")[-1].strip() for state in waiting), waiting
    assert all("<?, ? rows/s" in state for state in waiting), "no rate and no ETA before rows are counted"


def test_data_juicer_work_files_go_under_the_job_directory(bundled_demo):
    """Beside the export: the export and its documented side files only (the demo's job dir is there
    too); Data-Juicer's timestamped work dir is in the node's log folder of the job."""
    tmp, _ = bundled_demo
    demo = tmp / "outputs" / "demo"
    side = {"merged.jsonl.progress.json", "merged_stats.jsonl", "merged_overall_stats.csv", "merged_overall_stats.json"}
    names = {p.name for p in demo.iterdir()} - {"analysis"}  # dj-analyze of the demo (another test) writes there
    assert names == {"merged.jsonl", "job"} | side, names
    (work,) = (demo / "job" / "logs").glob("*/data-juicer/*")
    assert (work / "cli.yaml").is_file() and list((work / "logs").glob("export_merged.jsonl_time_*"))


def test_overall_stats_match_dj_analyze_on_the_merged_output(bundled_demo):
    """docs/analysis.md: `dj-analyze --config recipes/demo_analyze.yaml` on the merged output; its
    overall.csv equals the overall statistics finalize merged from the per-shard summaries."""
    import numpy as np
    import pandas as pd

    tmp, _ = bundled_demo
    demo = tmp / "outputs" / "demo"
    proc = run(["dj-analyze", "--config", "recipes/demo_analyze.yaml"], cwd=tmp, env=_without_torch(tmp))
    assert_ok(proc)
    assert not (tmp / "installs.log").exists(), f"dj-analyze tried to install: {(tmp / 'installs.log').read_text()}"
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
    values = np.sort([row[STATS]["text_len"] for row in read_jsonl(demo / "merged_stats.jsonl")]).astype(float)
    for label in quantiles:  # the stated bound: within alpha of both sorted values pandas interpolates
        h = float(label[:-1]) / 100 * (len(values) - 1)
        lo, hi = values[int(np.floor(h))], values[int(np.ceil(h))]
        error = abs(ours.loc[label, "text_len"] - expected.loc[label, "text_len"])
        assert error <= body["quantile_relative_accuracy"] * max(abs(lo), abs(hi)), (label, error)


def test_dj_analyze_never_overwrites_the_jobs_row_stats_and_verify_notices_a_changed_one(bundled_demo):
    """docs/analysis.md: `dj-analyze` with the elastic recipe on its export, or with any recipe whose
    export_path is that export, would write its stats over the job's merged_stats.jsonl: refused, exit 2,
    one line naming the file and another --export_path, the file as the merge published it.  And
    `dj-elastic verify` fails on that file rewritten as Data-Juicer's Exporter writes it."""
    tmp, _ = bundled_demo
    demo, env = tmp / "outputs" / "demo", _without_torch(tmp)
    stats = demo / "merged_stats.jsonl"
    before, listed = stats.read_bytes(), sorted(demo.rglob("*"))
    for cmd in (
        ["dj-analyze", "--config", "recipes/demo.yaml", "--dataset_path", "outputs/demo/merged.jsonl"],
        ["dj-analyze", "--config", "recipes/demo_analyze.yaml", "--export_path", "outputs/demo/merged.jsonl"],
    ):
        proc = run(cmd, cwd=tmp, env=env)
        assert proc.returncode == 2, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("dj-analyze: error: ConfigError: export_path: dj-analyze would overwrite"), last
        assert f"{stats}," in last and f"--export_path {demo / 'analysis' / 'merged.jsonl'}" in last, last
        assert stats.read_bytes() == before and sorted(demo.rglob("*")) == listed, "refused before writing"
    # the oracle: the merged rows themselves (text_length_filter's text_len of each row, in order)
    rows = read_jsonl(demo / "merged.jsonl")
    assert [line[STATS]["text_len"] for line in read_jsonl(stats)] == [len(row["text"]) for row in rows]

    verify = ["dj-elastic", "verify", "--job-dir", str(demo / "job")]
    assert_ok(run(verify, cwd=tmp))
    # Data-Juicer's Exporter writes the same stats with json.dumps' default separators
    lines = before.decode().splitlines()
    rewritten = "".join(json.dumps(json.loads(line), ensure_ascii=False) + "\n" for line in lines)
    assert rewritten.encode() != before
    try:
        stats.write_text(rewritten, encoding="utf-8")
        proc = run(verify, cwd=tmp)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        said = proc.stdout + proc.stderr
        recorded = json.loads((demo / "job" / "merge.json").read_text())["row_stats_sha256"]
        assert str(stats) in said and "row stats file is missing or changed since the merge" in said, said
        assert recorded in said and hashlib.sha256(rewritten.encode()).hexdigest() in said, said
    finally:
        stats.write_bytes(before)
    assert_ok(run(verify, cwd=tmp))


def _secs(text: str) -> float:
    """``23.2s``, ``4m05s``, ``1h02m03s`` (status.job_times.format_wall) in seconds."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?([\d.]+)s", text)
    assert match, text
    hours, minutes, secs = match.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(secs)


def test_the_console_status_and_report_give_the_run_the_same_times(bundled_demo, tmp_path):
    """One rule (status.job_times): the closing summary, `status` (text and --json) and the report
    give the run the same wall time, and status and the report the same time to the first shard
    running and to the last one done, to the second, whatever the process did before (imports, a
    shell's earlier work).  Each is checked against the job's own records: the run's record, its
    outcome and the attempts' start and end."""
    tmp, console = bundled_demo
    job = tmp / "outputs" / "demo" / "job"
    said = re.search(r" done in (\S+):", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", console))
    assert said, console[-2000:]
    proc = run(["dj-elastic", "status", "--job-dir", str(job), "--json"], cwd=tmp)
    document = json.loads(proc.stdout)
    times = document["times"]
    # the job summary as dj-process keeps it: its writer's last round (written as it left) saw
    # every shard done and no live claim, and status read the job with it
    written = json.loads((job / "summary" / "summary.json").read_text())
    assert (written["done_count"], written["live"], written["failed"]) == (8, [], [])
    assert len(list((job / "done").glob("*.json"))) == 8
    assert document["source"] == "summary" and document["summary"]["seq"] == written["seq"]
    # and its brief, what every worker read each round instead of summary.json: the round's seq
    # names it, and it says what the done markers say, in a fraction of the bytes
    brief_path, seq = job / "summary" / "brief.json.z", json.loads((job / "summary" / "summary.seq").read_text())
    brief = json.loads(zlib.decompress(brief_path.read_bytes()))
    assert seq["seq"] == written["seq"] and seq["brief"] == brief["checksum"]
    assert (brief["done"], brief["done_count"], brief["live_shards"], brief["failed"]) == (written["done"], 8, [], [])
    assert brief_path.stat().st_size < (job / "summary" / "summary.json").stat().st_size
    assert times["wall_secs"] == document["coordination"][0]["wall_secs"]
    assert document["first_shard_secs"] == times["first_shard_secs"]
    text = run(["dj-elastic", "status", "--job-dir", str(job)], cwd=tmp).stdout
    line = re.search(r"first shard running after (\S+), last shard done after (\S+), finalized after (\S+)", text)
    assert line, text
    report = tmp_path / "report.html"
    assert_ok(run(["dj-elastic", "report", "--job-dir", str(job), "--output", str(report)], cwd=tmp))
    html = report.read_text()

    def card(label: str) -> float:
        found = re.search(rf'<div class="card"><b class="">([^<]+)</b>{label}</div>', html)
        assert found, f"the report has a {label!r} card"
        return _secs(found.group(1))

    surfaces = {
        "wall": (_secs(said.group(1)), _secs(line.group(3)), card("wall time"), times["wall_secs"]),
        "first": (_secs(line.group(1)), card("first shard running after submission"), times["first_shard_secs"]),
        "last": (_secs(line.group(2)), card("last shard done after submission"), times["last_shard_secs"]),
    }
    for name, values in surfaces.items():
        assert max(values) - min(values) <= 1.0, (name, values)
    # the oracle: the job's own records (the run's record and outcome, the attempts' start and end)
    (run_dir,) = [p for p in (job / "coordination").iterdir() if (p / "run.json").is_file()]
    submitted = json.loads((run_dir / "run.json").read_text())["created_at"]
    decided = json.loads((run_dir / "outcome.json").read_text())["decided_at"]
    assert abs(times["wall_secs"] - (decided - submitted)) <= 0.01
    attempts = [json.loads(p.read_text()) for p in (job / "attempts").glob("*/*/attempt.json")]
    first = min(a["started_at"] for a in attempts) - submitted
    last = max(a["ended_at"] for a in attempts) - submitted
    assert abs(times["first_shard_secs"] - first) <= 1.0 and abs(times["last_shard_secs"] - last) <= 1.0, (
        times,
        first,
        last,
    )
