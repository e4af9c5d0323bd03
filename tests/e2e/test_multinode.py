"""Several instances of one `dj-process` command on one job, as a scheduler starts them on many
nodes (different DJ_ELASTIC_NODE_ID, one shared run id): elections, late joiners, a finalize
coordinator killed mid-merge, abort propagation, strict mode and slots.  Real commands, real Ray."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ..faults.crashpoints import hooked_pythonpath
from .conftest import DEMO_PROCESS, OPS_DIR, REPO, assert_ok, elastic_recipe, run

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

FAST = {"lease_ttl_secs": 10, "poll_interval_secs": 0.5, "wait_timeout_secs": 15}


def _recipe(tmp: Path, data: Path, name: str, *, seconds_per_row: float = 0.0, process=None, **elastic) -> Path:
    process = process or [{"e2e_sleep_mapper": {"seconds_per_row": seconds_per_row}}, *DEMO_PROCESS]
    recipe = elastic_recipe(tmp, data, name=name, process=process, **{"num_shards": 6, **FAST, **elastic})
    recipe.write_text(
        recipe.read_text() + f"custom_operator_paths: ['{OPS_DIR / 'e2e_ops.py'}']\nskip_op_error: false\n"
    )
    return recipe


class Instance:
    """One `dj-process` (or `dj-elastic run`) as a scheduler would start it on one node."""

    def __init__(self, recipe: Path, node: str, run_id: str | None, *, cmd=None, env=None):
        self.node = node
        self.log = recipe.parent / f"{recipe.stem}-{node}-{run_id}.log"
        # verbose: these tests read the coordination's log lines (elections, outcomes) on the console
        full_env = {**os.environ, "DJ_ELASTIC_NODE_ID": node, "DJ_ELASTIC_VERBOSE": "1", **(env or {})}
        full_env.pop("DJ_ELASTIC_RUN_ID", None)
        if run_id is not None:
            full_env["DJ_ELASTIC_RUN_ID"] = run_id
        with open(self.log, "w") as out:  # a file: a full pipe would block the instance
            self.proc = subprocess.Popen(
                cmd or ["dj-process", "--config", str(recipe)],
                cwd=recipe.parent,
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"{self.node} did not finish:\n{self.output[-3000:]}") from None

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def error_line(self) -> str:
        lines = [line for line in self.output.splitlines() if line.startswith("dj-process: error:")]
        return lines[-1] if lines else ""


def _start(recipe: Path, nodes, run_id, **kw) -> list[Instance]:
    return [Instance(recipe, node, run_id, **kw) for node in nodes]


def _all_ok(instances: list[Instance]) -> str:
    codes = [i.wait() for i in instances]
    text = "\n".join(f"===== {i.node}\n{i.output}" for i in instances)
    assert codes == [0] * len(instances), f"exit codes {codes}\n{text[-8000:]}"
    return text


def _job(recipe: Path) -> Path:
    return recipe.parent / recipe.stem / "job"


def _merged(recipe: Path) -> bytes:
    return (recipe.parent / recipe.stem / "merged.jsonl").read_bytes()


def _attempts_per_shard(job: Path) -> dict[str, int]:
    return {d.name: len(list(d.iterdir())) for d in sorted((job / "attempts").iterdir())}


def _status(job: Path) -> dict:
    proc = run(["dj-elastic", "status", "--job-dir", str(job), "--json"], cwd=job.parent)
    assert proc.returncode in (0, 1, 2), proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def one_node_output(tmp_path_factory, demo_input) -> bytes:
    tmp = tmp_path_factory.mktemp("reference")
    recipe = _recipe(tmp, demo_input, "reference")
    _all_ok(_start(recipe, ["solo"], None))
    return _merged(recipe)


@pytest.mark.extended
def test_three_instances_at_once_elect_one_prepare_and_one_finalize(tmp_path, demo_input, one_node_output):
    recipe = _recipe(tmp_path, demo_input, "three", seconds_per_row=0.01)
    instances = _start(recipe, ["node-a", "node-b", "node-c"], None, env={"PAI_JOB_ID": "dlc-42"})
    text = _all_ok(instances)
    assert text.count("elected as prepare coordinator") == 1
    assert text.count("elected as finalize coordinator") == 1
    planners = [i for i in instances if re.search(r"\bplanned \S+: \d+ shards over \d+ file\(s\)", i.output)]
    assert len(planners) == 1, "exactly one instance planned the job"
    job = _job(recipe)
    scanned_by = {json.loads(p.read_bytes())["node_id"] for p in (job / "scans" / "done").iterdir()}
    assert scanned_by <= {"node-a", "node-b", "node-c"} and scanned_by, "the instances scanned the shards"
    for instance in instances:  # every instance reports the same final result
        assert "run PAI_JOB_ID=dlc-42 finalized by" in instance.output
    assert _merged(recipe) == one_node_output

    (run_info,) = _status(job)["coordination"]
    assert run_info["run_id"] == "PAI_JOB_ID=dlc-42" and run_info["outcome"]["status"] == "ok"
    assert sorted(p["node_id"] for p in run_info["participants"]) == ["node-a", "node-b", "node-c"]
    assert all(p["exit_reason"] == "finalized" for p in run_info["participants"])
    assert sorted(p.name for p in (job / "logs").iterdir()) == ["node-a", "node-b", "node-c"]
    assert all(n == 1 for n in _attempts_per_shard(job).values())


@pytest.mark.extended
def test_a_late_instance_claims_what_is_left_or_reports_the_finished_run(tmp_path, demo_input, one_node_output):
    recipe = _recipe(tmp_path, demo_input, "late", seconds_per_row=0.03)
    early = _start(recipe, ["node-a", "node-b"], "late-run")
    time.sleep(20)
    late = Instance(recipe, "node-late", "late-run")
    _all_ok([*early, late])
    assert "run late-run finalized by" in late.output
    assert "elected as" not in late.output or "elected as finalize" in late.output
    assert all(n == 1 for n in _attempts_per_shard(_job(recipe)).values()), "no shard was redone"
    assert _merged(recipe) == one_node_output


@pytest.mark.extended
def test_a_resubmission_finishes_a_job_whose_finalize_coordinator_was_killed(tmp_path, demo_input, one_node_output):
    recipe = _recipe(tmp_path, demo_input, "killed")
    # SIGKILL itself with the merged output complete (streamed: the partial), before publishing it
    crash = {"DJ_ELASTIC_TEST_CRASH_AT": "finalize", "PYTHONPATH": hooked_pythonpath(os.environ.get("PYTHONPATH"))}
    first = _start(recipe, ["node-a", "node-b"], "sub-1", env=crash)
    codes = sorted(i.wait() for i in first)
    assert codes == [-signal.SIGKILL, 2], [i.output[-2000:] for i in first]
    survivor = next(i for i in first if i.proc.returncode == 2)
    # "exited" (its pid is gone) or "stopped renewing its heartbeat" (after lease_ttl_secs)
    assert "CoordinatorLostError" in survivor.error_line and "finalize coordinator" in survivor.error_line
    job = _job(recipe)
    assert not (recipe.parent / recipe.stem / "merged.jsonl").exists()
    attempts_before = _attempts_per_shard(job)

    _all_ok(_start(recipe, ["node-a"], "sub-2"))  # the re-submission: a new run id
    assert _merged(recipe) == one_node_output
    assert _attempts_per_shard(job) == attempts_before, "the re-submission reused every finished shard"
    runs = {r["run_id"]: r for r in _status(job)["coordination"]}
    assert runs["sub-1"]["outcome"]["status"] == "failed" and runs["sub-2"]["outcome"]["status"] == "ok"


@pytest.mark.extended
def test_an_always_failing_shard_stops_every_instance_with_the_same_message(tmp_path, demo_input):
    process = [{"e2e_fail_mapper": {"fail_id": 5}}, *DEMO_PROCESS]
    recipe = _recipe(tmp_path, demo_input, "fail", process=process, max_retries=1, wait_timeout_secs=600)
    t0 = time.monotonic()
    instances = _start(recipe, ["node-a", "node-b", "node-c"], "fail-run")
    codes = [i.wait() for i in instances]
    elapsed = time.monotonic() - t0
    assert codes == [2, 2, 2], [i.output[-2000:] for i in instances]
    lines = {i.error_line for i in instances}
    assert len(lines) == 1, lines
    (line,) = lines
    assert "ShardFailedError" in line and "part-00000-of-00006" in line and "refusing row id 5" in line
    assert elapsed < 200, "nobody waited for wait_timeout_secs"
    assert not (recipe.parent / recipe.stem / "merged.jsonl").exists()


@pytest.mark.extended
@pytest.mark.parametrize("started", [2, 3])
def test_strict_mode_needs_every_node(tmp_path, demo_input, one_node_output, started):
    recipe = _recipe(tmp_path, demo_input, f"strict{started}", require_all_nodes=True, nodes=3)
    instances = _start(recipe, [f"node-{i}" for i in range(started)], f"strict-{started}")
    if started == 3:
        _all_ok(instances)
        assert _merged(recipe) == one_node_output
        done = [json.loads(p.read_text())["node_id"] for p in (_job(recipe) / "done").iterdir()]
        assert sorted(done) == sorted([f"node-{i}" for i in range(3)] * 2), "each node completed its share of 2"
        return
    codes = [i.wait() for i in instances]
    assert codes == [2, 2], [i.output[-2000:] for i in instances]
    lines = {i.error_line for i in instances}
    assert len(lines) == 1, lines
    (line,) = lines
    assert "ParticipationError" in line and "only 2 of 3 node(s) joined" in line and "1 node(s) missing" in line


@pytest.mark.extended
def test_two_slots_on_one_node_run_shards_at_the_same_time(tmp_path, demo_input, one_node_output):
    recipe = _recipe(tmp_path, demo_input, "slots", seconds_per_row=0.03, num_shards=4, slots_per_node=2)
    cmd = ["dj-elastic", "run", "--config", str(recipe), "--ray-num-cpus", "1"]
    (instance,) = _start(recipe, ["big-node"], "slots-run", cmd=cmd)
    _all_ok([instance])
    assert _merged(recipe) == one_node_output
    job = _job(recipe)
    records = [json.loads(p.read_text()) for p in job.glob("attempts/*/*/attempt.json")]
    assert len(records) == 4 and {r["node_id"] for r in records} == {"big-node"}
    assert len({r["pid"] for r in records}) == 2, "two slot processes"
    spans = sorted((r["started_at"], r["ended_at"]) for r in records)
    overlap = max(min(a[1], b[1]) - max(a[0], b[0]) for i, a in enumerate(spans) for b in spans[i + 1 :])
    assert overlap > 1.0, f"both slots were never busy at once: {spans}"
    assert list((job / "logs" / "big-node").glob("*-slot1.log")), "the second slot logs beside the instance"


def test_launch_recipes_are_valid(tmp_path):
    """The shipped launch files parse (YAML) or pass `bash -n`."""
    import yaml

    launch = REPO / "recipes" / "launch"
    for path in sorted(launch.iterdir()):
        if path.suffix in (".yaml", ".yml"):
            assert list(yaml.safe_load_all(path.read_text())), path
        elif path.suffix == ".sh":
            assert_ok(run(["bash", "-n", str(path)], cwd=tmp_path))
