from __future__ import annotations

from data_juicer_elastic.coordination.run import DERIVED, resolve_run_id, run_key


def test_configured_run_id_wins_over_every_environment_variable(tmp_path):
    env = {"DJ_ELASTIC_RUN_ID": "env", "PAI_JOB_ID": "pai", "SLURM_JOB_ID": "7"}
    run = resolve_run_id("mine", env, tmp_path / "labels")
    assert (run.value, run.source, run.shared) == ("mine", "elastic.run_id", True)


def test_environment_order(tmp_path):
    labels = tmp_path / "labels"
    assert resolve_run_id(None, {"DJ_ELASTIC_RUN_ID": "a", "PAI_JOB_ID": "b"}, labels).value == "a"
    assert resolve_run_id(None, {"PAI_JOB_ID": "b", "DLC_JOB_ID": "c"}, labels).value == "PAI_JOB_ID=b"
    assert resolve_run_id(None, {"DLC_JOB_ID": "c", "JOB_ID": "d"}, labels).source == "DLC_JOB_ID"
    assert resolve_run_id(None, {"JOB_ID": "d", "SLURM_JOB_ID": "9"}, labels).source == "JOB_ID"


def test_slurm_steps_of_one_allocation_are_different_runs(tmp_path):
    labels = tmp_path / "labels"
    one = resolve_run_id(None, {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}, labels)
    two = resolve_run_id(None, {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "1"}, labels)
    assert one.value == "slurm-42.0" and two.value == "slurm-42.1" and one.key != two.key
    assert resolve_run_id(None, {"SLURM_JOB_ID": "42"}, labels).value == "slurm-42"


def test_kubernetes_job_uid_from_downward_api_labels(tmp_path):
    labels = tmp_path / "labels"
    labels.write_text('app="x"\nbatch.kubernetes.io/controller-uid="1b2c-3d"\njob-name="dj"\n')
    run = resolve_run_id(None, {}, labels)
    assert run.value == "k8s-job-1b2c-3d" and run.shared


def test_without_configuration_every_process_gets_its_own_run(tmp_path):
    a = resolve_run_id(None, {}, tmp_path / "missing")
    b = resolve_run_id(None, {}, tmp_path / "missing")
    assert a.source == DERIVED and not a.shared and a.value != b.value


def test_run_key_is_a_fixed_size_hex_path_component():
    key = run_key("../../etc/passwd with spaces/and-slashes")
    assert len(key) == 24 and all(c in "0123456789abcdef" for c in key)
    assert key == run_key("../../etc/passwd with spaces/and-slashes")
