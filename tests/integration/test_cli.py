"""User-visible behaviour of the unmodified dj-process / dj-analyze with the plugin installed."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from tests.integration.conftest import STAND_IN_RUNNER, console_script, elastic_recipe, run

pytestmark = pytest.mark.e2e

DJ_PROCESS = console_script("dj-process")
DJ_ANALYZE = console_script("dj-analyze")


def test_help_lists_elastic_sharded_and_elastic_options(tmp_path):
    result = run([DJ_PROCESS, "--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "{default,ray,ray_partitioned,elastic_sharded}" in result.stdout
    from data_juicer_elastic.settings import ElasticSettings

    for name in ElasticSettings.field_names():
        assert f"--elastic.{name}" in result.stdout
    assert "Shared job directory" in result.stdout  # help text from the field docstring
    # jsonargparse wraps executor_type's converter in a lambda; help names the type, not the lambda
    assert "<lambda>" not in result.stdout and "<function" not in result.stdout
    executor_help = result.stdout.split("--executor_type", 1)[1].split("ARG:", 1)[0]
    assert "type:" in executor_help and "str," in " ".join(executor_help.split())


@pytest.mark.parametrize(
    ("elastic", "cli", "named"),
    [
        ({"job_dir": "J", "num_shards": -1}, [], "elastic.num_shards"),
        ({"job_dir": "J"}, ["--elastic.max_shards", "x"], "elastic.max_shards"),  # jsonargparse's own message
        # The rest through the real dj-process in the extended run only (the settings checks
        # themselves are unit-tested in tests/integration/test_config_block.py and test_recipe_check.py).
        *(
            pytest.param(*case, marks=pytest.mark.extended)
            for case in [
                ({"job_dir": "J", "num_shards": "abc"}, [], "elastic.num_shards"),
                ({"job_dir": "J", "no_such_key": 1}, [], "elastic.no_such_key"),
                ({"num_shards": 2}, [], "elastic.job_dir"),
                ({"job_dir": "J"}, ["--elastic.heartbeat_interval_secs", "100"], "elastic.heartbeat_interval_secs"),
                ({"job_dir": "J", "ray_address": "not an address"}, [], "elastic.ray_address"),
                ({"job_dir": "J"}, ["--elastic.stall_timeout_secs", "0"], "elastic.stall_timeout_secs"),
            ]
        ),
    ],
)
def test_bad_elastic_values_exit_2_naming_the_field(tmp_path, dataset, write_recipe, elastic, cli, named):
    recipe = write_recipe(**elastic_recipe(dataset, tmp_path, elastic=elastic))
    result = run([DJ_PROCESS, "--config", str(recipe), *cli], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr
    assert "Traceback" not in result.stderr
    assert "<class" not in result.stderr, "types named as in a recipe (int, null), not by their Python repr"
    assert not (tmp_path / "job").exists()


def test_plugin_error_is_one_line(tmp_path, dataset, write_recipe):
    recipe = write_recipe(**elastic_recipe(dataset, tmp_path, elastic={"job_dir": "J", "num_shards": 0}))
    result = run([DJ_PROCESS, "--config", str(recipe)], cwd=tmp_path)
    ours = [line for line in result.stderr.splitlines() if line.startswith("dj-process: error:")]
    assert result.returncode == 2
    assert len(ours) == 1 and "ConfigError: elastic.num_shards" in ours[0]
    assert not (tmp_path / "out").exists()  # refused before Data-Juicer's setup wrote anything


@pytest.mark.extended
def test_builtin_default_executor_still_runs(tmp_path, dataset, write_recipe):
    recipe = write_recipe(
        project_name="plain",
        dataset_path=str(dataset),
        export_path=str(tmp_path / "out" / "result.jsonl"),
        np=1,
        # an elastic block is accepted and ignored by built-in executors
        elastic={"job_dir": str(tmp_path / "unused")},
        process=[{"whitespace_normalization_mapper": None}],
    )
    result = run([DJ_PROCESS, "--config", str(recipe)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "result.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == ["hello world", "second row", "third  row", "4th", "fifth row"]
    assert not (tmp_path / "unused").exists()


def test_elastic_recipe_is_dispatched_without_starting_ray(tmp_path, dataset, write_recipe):
    recipe = write_recipe(**elastic_recipe(dataset, tmp_path))
    runner = tmp_path / "runner.py"
    runner.write_text(STAND_IN_RUNNER)
    result = run(
        [sys.executable, str(runner), "--config", str(recipe), "--elastic.num_shards", "3"],
        cwd=tmp_path,
        env={"RAY_JOB": "1"},  # even then the driver must not start Ray
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("STAND-IN "))
    seen = json.loads(line.removeprefix("STAND-IN "))
    assert seen["executor_type"] == "elastic_sharded"
    assert seen["job_dir"] == str(tmp_path / "job")
    assert seen["ray_initialized"] is False
    assert seen["recipe"]["executor_type"] == "ray"
    assert "elastic" not in seen["recipe"] and "dataset_path" not in seen["recipe"]


@pytest.mark.extended
def test_dj_analyze_accepts_an_elastic_recipe(tmp_path, dataset, write_recipe):
    recipe = write_recipe(**elastic_recipe(dataset, tmp_path))
    export = tmp_path / "analysis" / "analysed.jsonl"
    result = run(
        [DJ_ANALYZE, "--config", str(recipe), "--dataset_path", str(dataset), "--export_path", str(export)],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (export.parent / "analysed_stats.jsonl").exists()
    assert not (tmp_path / "job").exists()


MOVED_FACTORY = """
# A Data-Juicer release in which ExecutorFactory.create_executor was renamed.
import sys, types
stub = types.ModuleType("data_juicer.core.executor.factory")
class ExecutorFactory:
    @staticmethod
    def make_executor(executor_type):
        raise ValueError(executor_type)
stub.ExecutorFactory = ExecutorFactory
sys.modules[stub.__name__] = stub
"""


@pytest.fixture
def moved_internal(tmp_path) -> dict:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(MOVED_FACTORY)
    return {"PYTHONPATH": str(site)}


@pytest.mark.extended
def test_moved_internal_refuses_elastic_with_one_clear_error(tmp_path, dataset, write_recipe, moved_internal):
    recipe = write_recipe(**elastic_recipe(dataset, tmp_path))
    result = run([DJ_PROCESS, "--config", str(recipe)], cwd=tmp_path, env=moved_internal)
    assert result.returncode == 2, result.stderr[-3000:]
    ours = [line for line in result.stderr.splitlines() if line.startswith("dj-process: error:")]
    assert len(ours) == 1
    assert "IntegrationError" in ours[0]
    assert "data_juicer.core.executor.factory.ExecutorFactory.create_executor" in ours[0]
    assert "Traceback" not in result.stderr


@pytest.mark.extended
def test_moved_internal_keeps_builtin_executors_working(tmp_path, dataset, write_recipe, moved_internal):
    recipe = write_recipe(
        dataset_path=str(dataset),
        export_path=str(tmp_path / "out" / "result.jsonl"),
        np=1,
        process=[{"whitespace_normalization_mapper": None}],
    )
    result = run([DJ_PROCESS, "--config", str(recipe)], cwd=tmp_path, env=moved_internal)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len((tmp_path / "out" / "result.jsonl").read_text().splitlines()) == 5


@pytest.mark.extended
def test_moved_internal_reported_before_the_parser_when_it_is_the_parser(tmp_path, dataset, write_recipe):
    # Without a patched parser, Data-Juicer would only say "invalid choice".
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import data_juicer_elastic.integration.patches as p\np.mark(p.BUILD_PARSER, 'missing', 'function not found')\n"
    )
    recipe = write_recipe(**elastic_recipe(dataset, tmp_path))
    result = run([DJ_PROCESS, "--config", str(recipe)], cwd=tmp_path, env={"PYTHONPATH": str(site)})
    assert result.returncode == 2
    assert "IntegrationError: data_juicer.config.config.build_base_parser" in result.stderr


def _run_and_list_imports(argv: list[str], cwd):
    """``dj-elastic argv`` in a child that prints which of Data-Juicer and Ray it imported."""
    probe = (
        "import sys; from data_juicer_elastic.cli import main; "
        f"code = main({argv!r}); "
        "print('loaded:', sorted(m for m in ('data_juicer', 'ray') if m in sys.modules)); sys.exit(code)"
    )
    return run([sys.executable, "-c", probe], cwd=cwd)


@pytest.mark.parametrize("command", [["worker"], ["merge", "--output", "out.jsonl"]])
def test_dj_elastic_refuses_an_unprepared_job_before_loading_data_juicer(tmp_path, command):
    """One line and exit 2 without importing Data-Juicer (seconds of imports) or Ray."""
    result = _run_and_list_imports([command[0], "--job-dir", str(tmp_path / "nope"), *command[1:]], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "not prepared" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "loaded: []" in result.stdout


@pytest.fixture
def finished_job(tmp_path):
    """A prepared job with an accepted result for every shard, made without Ray."""
    from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
    from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job
    from data_juicer_elastic.sharedfs.identity import WorkerIdentity
    from tests.rayfree import rayfree_runner

    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(40)))
    job = tmp_path / "job"
    export = str(tmp_path / "exports" / "recipe-export.jsonl")  # what prepare records of the recipe's export_path
    prepare_job(
        PrepareRequest(job_dir=job, dataset_path=data, num_shards=4, recipe={}, stage_identities=[], export_path=export)
    )
    run_worker(
        job,
        WorkerIdentity.current("n"),
        rayfree_runner(job),
        WorkerSettings(ttl_secs=60, heartbeat_secs=10, max_retries=0, poll_interval_secs=0.1),
    )
    return job


def test_dj_elastic_status_into_a_pipe_its_reader_closed_is_no_storage_error(tmp_path, finished_job):
    """`dj-elastic status | head -1`: the reader may leave before status writes; that is the
    reader's choice, not a filesystem fault (exit 141, as a tool SIGPIPE ended, and nothing on stderr)."""
    proc = subprocess.Popen(
        [console_script("dj-elastic"), "status", "--job-dir", str(finished_job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # before status has read the job: its first write finds no reader
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and stderr == "", stderr


def test_a_worker_on_a_complete_job_says_who_writes_the_export_or_where_it_was_merged(tmp_path, finished_job):
    from types import SimpleNamespace

    from data_juicer_elastic.console.summary import worker_done_line
    from data_juicer_elastic.shards.merge import merge_job

    ran = SimpleNamespace(stop_reason="complete", done=4, failed=0, complete=True)
    idle = SimpleNamespace(stop_reason="complete", done=0, failed=0, complete=True)
    to_merge = "Workers do not write the export: `dj-elastic merge --job-dir"
    assert to_merge in worker_done_line(finished_job, ran) and to_merge in worker_done_line(finished_job, idle)
    export = tmp_path / "exports" / "recipe-export.jsonl"
    merge_job(finished_job, export)
    assert to_merge in worker_done_line(finished_job, ran), "its shards ran after any merge: merge again"
    line = worker_done_line(finished_job, idle)
    assert line.endswith(f"the job is complete and merged into {export} (dj-elastic verify checks it)"), line


def test_dj_elastic_verify_names_the_files_added_to_a_directory_input_after_planning(tmp_path):
    from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
    from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job
    from data_juicer_elastic.sharedfs.identity import WorkerIdentity
    from tests.rayfree import rayfree_runner

    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    for name in ("a.jsonl", "sub/b.jsonl"):
        (data / name).write_text("".join(json.dumps({"text": f"{name} {i}"}) + "\n" for i in range(5)))
    job = tmp_path / "job"
    prepare_job(PrepareRequest(job_dir=job, dataset_path=data, num_shards=2, recipe={}, stage_identities=[]))
    settings = WorkerSettings(ttl_secs=60, heartbeat_secs=10, max_retries=0, poll_interval_secs=0.1)
    run_worker(job, WorkerIdentity.current("n"), rayfree_runner(job), settings)
    verify = [console_script("dj-elastic"), "verify", "--job-dir", str(job)]
    before = run(verify, cwd=tmp_path)
    assert before.returncode == 0 and "note:" not in before.stdout, before.stdout + before.stderr
    (data / "sub" / "late.jsonl").write_text('{"text": "came after the plan"}\n')
    (data / "notes.txt").write_text("not an input file")
    after = run(verify, cwd=tmp_path)
    assert after.returncode == 0, after.stderr
    note = (
        f"note: 1 file(s) added to {data} after planning were not processed (sub/late.jsonl): a new job_dir plans them"
    )
    assert after.stdout.splitlines()[-1] == note, after.stdout


@pytest.mark.parametrize("command", [["merge", "--output", "out.jsonl"], ["status"], ["verify"]])
def test_dj_elastic_merge_status_verify_never_import_data_juicer_or_ray(tmp_path, finished_job, command):
    """Seconds of imports for a copy with validation, a listing or a check: none of them needs either."""
    result = _run_and_list_imports([command[0], "--job-dir", str(finished_job), *command[1:]], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "loaded: []" in result.stdout
    if command[0] == "merge":
        assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 40


def test_dj_elastic_merge_without_output_writes_the_recipes_export_path_and_says_when_it_was_there(
    tmp_path, finished_job
):
    """The input is the oracle (the rayfree runner passes rows through); a second merge finds the
    export identical and says so in one line, not that it merged."""
    merge = [console_script("dj-elastic"), "merge", "--job-dir", str(finished_job)]
    first, again = run(merge, cwd=tmp_path), run(merge, cwd=tmp_path)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    export = tmp_path / "exports" / "recipe-export.jsonl"
    rows = [json.loads(line) for line in export.read_text().splitlines()]
    assert rows == [json.loads(line) for line in (tmp_path / "in.jsonl").read_text().splitlines()]
    assert "merged 40 rows from 4 shards into exports/recipe-export.jsonl" in first.stdout + first.stderr
    said = (again.stdout + again.stderr).strip().splitlines()
    unchanged = "exports/recipe-export.jsonl already held these 40 rows from 4 shards, identical: left unchanged"
    assert said[-1].endswith(f" {unchanged}"), said
    assert not any(" merged " in line for line in said), said


def test_dj_elastic_merge_without_output_of_a_job_with_no_recorded_export_path_asks_for_output(tmp_path):
    from data_juicer_elastic.shards.prepare import PrepareRequest, plan_job

    data = tmp_path / "in.jsonl"
    data.write_text('{"text": "a"}\n')
    plan_job(PrepareRequest(job_dir=tmp_path / "job", dataset_path=data, num_shards=1, recipe={}, stage_identities=[]))
    result = run([console_script("dj-elastic"), "merge", "--job-dir", str(tmp_path / "job")], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "records no export_path" in line and "--output PATH" in line, line


@pytest.mark.parametrize("verbose", ["", pytest.param("1", marks=pytest.mark.extended)])
def test_a_refused_input_is_one_line_and_quiet_shows_no_configuration_table(tmp_path, write_recipe, verbose):
    """Quiet (the default), the refusal is the console's last line and nothing big comes before it;
    DJ_ELASTIC_VERBOSE=1 (dj-process's argv is Data-Juicer's, so an env var) brings the table back."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 0, "text": "fine"}\n{"id": 1, "text": \n')
    recipe = write_recipe(**elastic_recipe(bad, tmp_path))
    result = run([DJ_PROCESS, "--config", str(recipe)], cwd=tmp_path, env={"DJ_ELASTIC_VERBOSE": verbose})
    console = result.stdout + result.stderr
    assert result.returncode == 2, console[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("dj-process: error: InputError") and f"{bad}:2" in last
    assert "Traceback" not in console
    if verbose:
        assert "╒" in console and "Configuration table" in console
    else:
        assert "╒" not in console and len(console.splitlines()) <= 4, console


@pytest.mark.parametrize("command", [[DJ_PROCESS], [console_script("dj-elastic"), "prepare"]])
def test_a_missing_dataset_path_is_the_plugins_one_error_without_data_juicers_remote_dataset_warning(
    tmp_path, write_recipe, command
):
    missing = tmp_path / "nowhere.jsonl"
    recipe = write_recipe(**elastic_recipe(missing, tmp_path))
    result = run([*command, "--config", str(recipe)], cwd=tmp_path)
    console = result.stdout + result.stderr
    assert result.returncode == 2, console[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert line.endswith(f"InputError: {missing}: dataset_path does not exist (check the path on this node)") or (
        line == f"error: {missing}: dataset_path does not exist (check the path on this node)"
    ), line
    assert "remote dataset" not in console, console[-3000:]
    assert not (tmp_path / "job").exists() and not (tmp_path / "out").exists()


CUSTOM_MAPPER = """
from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("elastic_cli_test_upper_mapper")
class UpperMapper(Mapper):
    def process_single(self, sample):
        sample["text"] = sample["text"].upper()
        return sample
"""


def test_custom_operators_load_once_and_a_broken_one_is_the_same_error_from_every_command(
    tmp_path, dataset, write_recipe
):
    """``dj-elastic prepare`` loads a recipe's custom operators (Data-Juicer's parse, the recipe check and the
    code fingerprint each ask for them) once; a broken file is one line, exit 2, worded the same by
    ``dj-process`` and ``dj-elastic prepare``, naming the file and line, and leaves no job directory."""
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "elastic_cli_test_ops.py").write_text(CUSTOM_MAPPER)
    good = write_recipe(
        **elastic_recipe(
            dataset,
            tmp_path,
            custom_operator_paths=[str(ops / "elastic_cli_test_ops.py")],
            process=[{"elastic_cli_test_upper_mapper": None}],
        )
    )
    result = run([console_script("dj-elastic"), "prepare", "--config", str(good)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    plan = json.loads((tmp_path / "job" / "plan.json").read_text())
    assert "elastic_cli_test_upper_mapper" in json.dumps(plan)

    broken = ops / "elastic_cli_test_broken.py"
    broken.write_text(CUSTOM_MAPPER + "raise ValueError('half-written operator')\n")
    line = len(CUSTOM_MAPPER.splitlines()) + 1
    recipe = write_recipe(
        "broken.yaml",
        **elastic_recipe(dataset, tmp_path, custom_operator_paths=[str(broken)], elastic={"job_dir": "J2"}),
    )
    lines = {}
    for prog, argv in [("dj-process", [DJ_PROCESS]), ("dj-elastic", [console_script("dj-elastic"), "prepare"])]:
        result = run([*argv, "--config", str(recipe)], cwd=tmp_path)
        assert result.returncode == 2, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        last = result.stderr.strip().splitlines()[-1]
        lines[prog] = last.removeprefix("dj-process: error: RecipeError: ").removeprefix("error: ")
        assert not (tmp_path / "J2").exists()
    assert lines["dj-process"] == lines["dj-elastic"]
    assert lines["dj-process"].startswith(f"{broken}:{line}: ")
    assert "ValueError: half-written operator" in lines["dj-process"]


def test_a_merge_that_rewrote_only_a_side_file_says_so(tmp_path):
    """`merge --overwrite` after the stats file beside an intact export was changed: the export is
    left as it was, the stats file is rewritten, and the line says both (not 'left unchanged' alone)."""
    from data_juicer_elastic.finalize import merged_line
    from data_juicer_elastic.jobdir.exports import MergedSideFile
    from data_juicer_elastic.shards.merge import MergeResult

    export, stats = tmp_path / "m.jsonl", tmp_path / "m_stats.jsonl"
    same = MergeResult(export, 40, 400, "a" * 64, 4, written=False)
    kept = MergedSideFile(stats, 40, 100, "b" * 64, written=False)
    assert merged_line(same).endswith("identical: left unchanged")
    assert merged_line(dataclasses.replace(same, row_stats=kept)).endswith("identical: left unchanged")
    rewritten = merged_line(dataclasses.replace(same, row_stats=dataclasses.replace(kept, written=True)))
    assert rewritten.endswith(f"identical: left unchanged; rewrote {stats}, which differed"), rewritten
