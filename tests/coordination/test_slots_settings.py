from __future__ import annotations

import dataclasses
import sys

import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from data_juicer_elastic.cli import _settings_from_job, build_parser
from data_juicer_elastic.cli_options import WORKER_OPTIONS, setting_args
from data_juicer_elastic.coordination.slots import slot_argv, slot_cpus, slot_devices, slot_env
from data_juicer_elastic.errors import ConfigError, JobDirError
from data_juicer_elastic.jobdir.layout import ROLE_TASK, JobLayout
from data_juicer_elastic.jobdir.worker import WorkerSettings
from data_juicer_elastic.settings import ElasticSettings, check_values
from data_juicer_elastic.shards.prepare import PrepareRequest, plan_job


def test_each_slot_gets_its_own_devices():
    assert slot_devices("0,1,2,3", 2) == ["0,1", "2,3"]
    assert slot_devices("0,1,2,3", 4) == ["0", "1", "2", "3"]
    assert slot_devices("4,5,6", 2) == ["4,5", "6"]
    assert slot_devices("GPU-aa,GPU-bb", 2) == ["GPU-aa", "GPU-bb"]


def test_no_devices_listed_means_cpu_slots():
    assert slot_devices(None, 3) == [None, None, None]
    assert slot_devices("", 2) == [None, None]
    assert slot_devices("-1", 2) == [None, None]


def test_more_slots_than_gpus_is_refused():
    with pytest.raises(ConfigError) as info:
        slot_devices("0,1", 4)
    assert info.value.where == "elastic.slots_per_node" and "only 2 GPU" in str(info.value)


def test_slot_cpus_divides_the_node_unless_set():
    assert slot_cpus(None, 1, 16) is None
    assert slot_cpus(None, 4, 16) == 4
    assert slot_cpus(None, 4, 2) == 1
    assert slot_cpus(3, 4, 16) == 3


def test_slot_processes_keep_the_node_identity():
    env = slot_env("node-7", "2,3", {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "DJ_ELASTIC_NODE_ID": "node-7", "CUDA_VISIBLE_DEVICES": "2,3"}


@pytest.mark.parametrize(
    "values, where",
    [
        ({"require_all_nodes": True}, "elastic.nodes"),
        ({"require_all_nodes": True, "nodes": 3, "num_shards": 8}, "elastic.num_shards"),
        ({"require_all_nodes": True, "nodes": 2, "num_shards": 6, "slots_per_node": 2}, "elastic.num_shards"),
        ({"slots_per_node": 0}, "elastic.slots_per_node"),
        ({"wait_timeout_secs": 0}, "elastic.wait_timeout_secs"),
        ({"run_id": "  "}, "elastic.run_id"),
        ({"nodes": 0}, "elastic.nodes"),
        ({"max_holder_deaths": -1}, "elastic.max_holder_deaths"),
        ({"max_holder_deaths": True}, "elastic.max_holder_deaths"),
        ({"stall_timeout_secs": 0}, "elastic.stall_timeout_secs"),
        ({"allow_version_mismatch": "yes"}, "elastic.allow_version_mismatch"),
    ],
)
def test_bad_coordination_settings_name_the_key(values, where):
    with pytest.raises(ConfigError) as info:
        ElasticSettings(job_dir="/j", **values)
    assert info.value.where == where


def test_strict_settings_with_equal_shares_are_valid():
    s = ElasticSettings(job_dir="/j", require_all_nodes=True, nodes=3, num_shards=12, slots_per_node=2)
    assert s.require_all_nodes and s.nodes == 3


def test_coordination_paths_stay_inside_the_job_directory(tmp_path):
    layout = JobLayout(tmp_path)
    key = "0123456789abcdef01234567"
    assert layout.outcome(key) == tmp_path / "coordination" / key / "outcome.json"
    role = layout.role_lease(key, "finalize")
    assert (
        role.claim(ROLE_TASK, 1)
        == tmp_path / "coordination" / key / "finalize" / "claims" / ROLE_TASK / "gen-000001.json"
    )
    assert layout.node_log("a/../b", "inst-1").parent == tmp_path / "logs" / "a_.._b"
    for bad in ("../x", "ABC", "short"):
        with pytest.raises(JobDirError):
            layout.run_dir(bad)
    with pytest.raises(ValueError):
        layout.role_lease(key, "work")


def test_auto_refuses_a_runtime_that_is_not_this_nodes_own():
    from data_juicer_elastic.errors import RayConnectionError
    from data_juicer_elastic.execution.ray_runtime import check_topology

    check_topology("auto", 1, True)
    check_topology("10.0.0.5:6379", 3, False)  # explicit: the user's choice, only warned about
    for nodes, local in ((3, True), (1, False)):
        with pytest.raises(RayConnectionError) as info:
            check_topology("auto", nodes, local)
        assert info.value.where == "ray_address=auto" and "ray start --head" in info.value.hint


def test_check_values_judges_the_values_given_and_relations_only_when_both_are_given():
    check_values({"heartbeat_interval_secs": 30.0})  # no lease_ttl_secs given: only its own rule
    check_values({"lease_ttl_secs": 60.0, "heartbeat_interval_secs": 20.0})
    with pytest.raises(ConfigError, match="lease_ttl_secs / 2") as bad:
        check_values({"lease_ttl_secs": 60.0, "heartbeat_interval_secs": 30.0})
    assert bad.value.where == "elastic.heartbeat_interval_secs"
    with pytest.raises(ConfigError) as bad:
        check_values({"heartbeat_interval_secs": 0})
    assert bad.value.where == "elastic.heartbeat_interval_secs"


# -- a slot's command line carries the instance's settings -------------------------------------------

_POSITIVE = st.floats(min_value=0.001, max_value=1e6, allow_nan=False, allow_infinity=False)
# The job's recorded settings differ from every value a slot is given, except where an option cannot
# state the value (max_shards None, allow_version_mismatch off): then the slot takes the job's.
_RECORDED = {
    "lease_ttl_secs": 987.0, "heartbeat_interval_secs": 99.0, "max_retries": 7, "poll_interval_secs": 3.5,
    "max_holder_deaths": 77, "stall_timeout_secs": 4321.0, "claim_ahead": False, "max_error_rows": 0.5,
    "ray_address": "auto", "ray_num_cpus": 99,
}  # fmt: skip


@st.composite
def _worker_values(draw) -> dict:
    ttl = draw(_POSITIVE)
    return {
        "max_shards": draw(st.none() | st.integers(1, 10**6)),
        "ray_address": draw(st.sampled_from(["local", "10.0.0.7:6379", "ray://head-1:10001"])),
        "lease_ttl_secs": ttl,
        "heartbeat_interval_secs": draw(st.none() | st.floats(0.01, 0.49).map(lambda f: f * ttl)),
        "max_retries": draw(st.integers(0, 50)),
        "poll_interval_secs": draw(_POSITIVE),
        "max_holder_deaths": draw(st.integers(0, 50)),
        "stall_timeout_secs": draw(_POSITIVE),
        "allow_version_mismatch": draw(st.booleans()),
        "claim_ahead": draw(st.booleans()),
        "max_error_rows": draw(st.integers(1, 10**6) | st.floats(0, 1, exclude_max=True)),
    }


@pytest.fixture(scope="module")
def recorded_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slots")
    data = tmp / "input.jsonl"
    data.write_text("".join(f'{{"id": {i}}}\n' for i in range(4)))
    request = PrepareRequest(job_dir=tmp / "job", dataset_path=data, num_shards=2, recipe={"process": []},
                             stage_identities=[], settings=_RECORDED)  # fmt: skip
    plan_job(request)
    return tmp / "job"


@examples(max_examples=50, deadline=None)
@given(values=_worker_values(), cpus=st.integers(1, 64), max_done=st.none() | st.integers(1, 100))
def test_every_setting_reaches_a_slot_through_its_command_line(recorded_job, values, cpus, max_done):
    """settings -> the slot's argv -> the ``dj-elastic worker`` parser -> the slot's settings, as
    ``dj-elastic worker`` reads them (the job's recorded settings, overridden by its options)."""
    assert set(values) | {"ray_num_cpus"} == set(WORKER_OPTIONS), "every option of a worker is drawn"
    instance = ElasticSettings.from_mapping({"job_dir": str(recorded_job), **values})
    slot = dataclasses.replace(instance, ray_num_cpus=cpus, heartbeat_interval_secs=instance.heartbeat_secs)
    argv = slot_argv(recorded_job, setting_args(slot, WORKER_OPTIONS), max_done)
    assert argv[:4] == [sys.executable, "-m", "data_juicer_elastic.cli", "worker"]
    args = build_parser().parse_args(argv[3:])
    assert (args.slots, args.no_wait, args.max_done) == (1, True, max_done), "one slot, no waiting, its share"
    got = _settings_from_job(args.job_dir, args)
    assert {name: getattr(got, name) for name in WORKER_OPTIONS} == {
        name: getattr(slot, name) for name in WORKER_OPTIONS
    }
    as_run = dict(max_done=args.max_done, wait_for_completion=not args.no_wait, random_start=True)
    assert WorkerSettings.from_elastic(got, **as_run) == WorkerSettings.from_elastic(
        instance, max_done=max_done, wait_for_completion=False, random_start=True
    )
