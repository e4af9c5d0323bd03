"""The live line of a real `dj-process` run on a terminal: the rows count up through each shard as
Ray's tasks finish its blocks (not a whole shard at a time), and every line the run draws (the
plan, the scans, the shards, the merge) shows one elapsed clock, the one the closing summary uses."""

from __future__ import annotations

import datetime
import itertools
import json
import re

import pytest
import yaml

from data_juicer_elastic.jobdir.manifest import load_manifest
from tests.pty_run import CLEAR_LINE, redraws, run_on_terminal

from .conftest import OPS_DIR, assert_ok, elastic_recipe, read_jsonl

# A run of its own (shards of several blocks, an operator slow enough to see each one): about 90 s
# on a loaded 2-core machine, so in the extended tier.
pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.extended]

SHARDS = 2
ROWS = 4096  # equal rows of ~1 KiB: 2 MiB a shard, three blocks (execution.shard_reader.BLOCK_BYTES)
SECS_PER_ROW = 0.001  # about a second a block: the live line (redrawn twice a second) sees each one
ELAPSED = re.compile(r"\[(?:(\d+):)?(\d\d):(\d\d)[<\],]")


def _secs(match: re.Match) -> int:
    hours, minutes, secs = match.groups()
    return int(hours or 0) * 3600 + int(minutes) * 60 + int(secs)


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live-line")
    data = tmp / "input.jsonl"
    rows = [{"id": i, "text": f"row {i:05d} " + "live " * 200} for i in range(ROWS)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    process = [{"e2e_sleep_mapper": {"seconds_per_row": SECS_PER_ROW}}]
    recipe = elastic_recipe(tmp, data, num_shards=SHARDS, process=process)
    fields = yaml.safe_load(recipe.read_text())
    fields["custom_operator_paths"] = [str(OPS_DIR / "e2e_ops.py")]
    recipe.write_text(yaml.safe_dump(fields, sort_keys=False))
    proc = run_on_terminal(["dj-process", "--config", str(recipe)], cwd=tmp, env={"DJ_ELASTIC_VERBOSE": ""})
    (tmp / "console.txt").write_text(proc.stdout)  # what the terminal got, kept for a failure's post-mortem
    assert_ok(proc)
    return tmp, rows, proc.stdout


def test_the_rows_count_up_inside_each_shard(live_run):
    tmp, rows, drawn = live_run
    assert read_jsonl(tmp / "job" / "merged.jsonl") == rows, "the output is the input (the operator only waits)"
    counts = [int(m.group(1)) for state in redraws(drawn) if (m := re.search(rf"\b(\d+)/{ROWS} \[", state))]
    assert counts == sorted(counts), "the count never goes back"
    sizes = [entry.rows for entry in load_manifest(tmp / "job" / "job").shards]
    whole = {sum(chosen) for k in range(len(sizes) + 1) for chosen in itertools.combinations(sizes, k)}
    inside = sorted(set(counts) - whole)
    assert inside, f"only whole shards {sizes} were counted: {sorted(set(counts))}"
    assert len(set(counts)) > SHARDS + 1, sorted(set(counts))


def test_every_line_of_the_run_shows_one_clock_from_the_runs_submission(live_run):
    """The scans' and the shards' lines show one elapsed time that never starts again, and it is
    the run's: drawn just after a timestamped line ("planned", "scanned"), it is that stamp less
    the submission time in the run's record (what the closing summary, `status` and the report
    count from), to the stamps' and the line's whole seconds."""
    tmp, _, drawn = live_run
    elapsed = [_secs(m) for state in redraws(drawn) if (m := ELAPSED.search(state))]
    assert len(elapsed) >= 3, drawn[-3000:]
    assert elapsed == sorted(elapsed), f"a clock started again: {elapsed}"
    (record,) = (tmp / "job" / "job" / "coordination").glob("*/run.json")
    submitted = json.loads(record.read_text())["created_at"]
    day = datetime.datetime.fromtimestamp(submitted).date()
    checked, stamp = [], None
    for part in re.sub(r"\x1b\[[0-9;?]*m", "", drawn).split(CLEAR_LINE):
        said = re.match(r"(\d\d:\d\d:\d\d) (planned|scanned) ", part)
        if said:
            clock = datetime.datetime.combine(day, datetime.time.fromisoformat(said.group(1)))
            stamp = clock.timestamp() - submitted
        elif stamp is not None and (m := ELAPSED.search(part)):
            checked.append((stamp, _secs(m)))
            stamp = None
    assert checked, drawn[-3000:]
    for since_submission, shown in checked:
        assert abs(shown - since_submission) <= 2.0, checked
    wall = re.search(r" done in (?:(\d+)m)?([\d.]+)s:", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn))
    assert wall and elapsed[-1] <= 60 * int(wall.group(1) or 0) + float(wall.group(2)) + 1.0, (elapsed[-1], wall)


def test_the_line_names_the_deduplication_phase_before_the_shards_run(tmp_path):
    """A recipe with a deduplicator after a slow operator: while the signature runs work (the operator
    before the deduplicator runs in them), the line names the phase as `dj-elastic status` does."""
    data = tmp_path / "input.jsonl"
    rows = [{"id": i, "text": f"row {i % 50:05d}"} for i in range(400)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    process = [{"e2e_sleep_mapper": {"seconds_per_row": 0.01}}, {"document_deduplicator": None}]
    recipe = elastic_recipe(tmp_path, data, num_shards=SHARDS, process=process)
    fields = yaml.safe_load(recipe.read_text())
    fields["custom_operator_paths"] = [str(OPS_DIR / "e2e_ops.py")]
    recipe.write_text(yaml.safe_dump(fields, sort_keys=False))
    proc = run_on_terminal(["dj-process", "--config", str(recipe)], cwd=tmp_path, env={"DJ_ELASTIC_VERBOSE": ""})
    (tmp_path / "console.txt").write_text(proc.stdout)
    assert_ok(proc)
    assert [row["id"] for row in read_jsonl(tmp_path / "job" / "merged.jsonl")] == list(range(50))
    states = [state for state in redraws(proc.stdout) if "dedup 1/1 document_deduplicator: " in state]
    assert any(re.search(r"dedup 1/1 document_deduplicator: signatures [01]/2", s) for s in states), proc.stdout[-3000:]
