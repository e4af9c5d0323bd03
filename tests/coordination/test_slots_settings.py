from __future__ import annotations

import pytest

from data_juicer_elastic.coordination.slots import slot_argv, slot_cpus, slot_devices, slot_env
from data_juicer_elastic.errors import ConfigError, JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.settings import ElasticSettings, check_values


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


def test_slot_processes_keep_the_node_identity(tmp_path):
    env = slot_env("node-7", "2,3", {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "DJ_ELASTIC_NODE_ID": "node-7", "CUDA_VISIBLE_DEVICES": "2,3"}
    argv = slot_argv(
        tmp_path,
        ray_address="local",
        ray_num_cpus=2,
        lease_ttl_secs=30,
        heartbeat_secs=5,
        max_retries=1,
        poll_interval_secs=1,
        max_done=3,
        max_holder_deaths=4,
        stall_timeout_secs=90,
        allow_version_mismatch=True,
    )
    assert argv[1:4] == ["-m", "data_juicer_elastic.cli", "worker"] and "--no-wait" in argv
    assert argv[argv.index("--max-done") + 1] == "3" and argv[argv.index("--ray-num-cpus") + 1] == "2"
    assert argv[argv.index("--slots") + 1] == "1", "a slot never starts slots of its own"
    # the slot's own command line parses, and carries the instance's budgets and stall rule
    from data_juicer_elastic.cli import build_parser

    args = build_parser().parse_args(argv[3:])
    assert (args.max_holder_deaths, args.stall_timeout_secs, args.allow_version_mismatch) == (4, 90.0, True)
    assert args.claim_ahead is True
    off = slot_argv(tmp_path, ray_address="local", ray_num_cpus=None, lease_ttl_secs=30, heartbeat_secs=5,
                    max_retries=1, poll_interval_secs=1, max_done=None, max_holder_deaths=4,
                    stall_timeout_secs=90, claim_ahead=False)  # fmt: skip
    assert build_parser().parse_args(off[3:]).claim_ahead is False, "a slot follows the instance's claim_ahead"


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
    assert layout.leader(key, "finalize").name == "finalize.leader.json"
    assert layout.node_log("a/../b", "inst-1").parent == tmp_path / "logs" / "a_.._b"
    for bad in ("../x", "ABC", "short"):
        with pytest.raises(JobDirError):
            layout.run_dir(bad)
    with pytest.raises(ValueError):
        layout.leader(key, "work")


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
