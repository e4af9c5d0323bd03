"""The whole protocol with several instances (threads) on one job directory, without Ray."""

from __future__ import annotations

import threading
import time

import pytest

from data_juicer_elastic.coordination.flow import StrictPolicy, run_coordinated
from data_juicer_elastic.errors import ElasticError, InputError, ParticipationError, ShardFailedError

from ..jobdir.conftest import copy_runner
from .conftest import FAST, Recorder, coordinator


def _instances(recorder: Recorder, nodes: list[str], run: str = "run-1", delays=None, **kw):
    """Run one instance per node in threads; {node: outcome or exception}."""
    results: dict[str, object] = {}

    def one(node: str, delay: float) -> None:
        time.sleep(delay)
        c = coordinator(recorder.job, node, run=run)
        c.join()
        try:
            results[node] = run_coordinated(
                c,
                recorder.phases(node, kw.get("max_retries", 0)),
                wait_timeout_secs=FAST.wait_timeout_secs,
                **kw.get("flow", {}),
            )
        except ElasticError as exc:
            results[node] = exc

    delays = delays or {}
    threads = [threading.Thread(target=one, args=(n, delays.get(n, 0.0))) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results


def test_three_instances_one_prepare_one_finalize_same_outcome(recorder):
    results = _instances(recorder, ["a", "b", "c"])
    assert len(recorder.calls["prepare"]) == 1 and len(recorder.calls["finalize"]) == 1
    assert sorted(recorder.calls["check"]) == sorted(set("abc") - set(recorder.calls["prepare"]))
    outcomes = list(results.values())
    assert all(o == outcomes[0] and o.ok for o in outcomes), results
    assert outcomes[0].details["rows"] == 40 and recorder.output.exists()


def test_a_late_joiner_after_the_end_redoes_nothing(recorder):
    first = _instances(recorder, ["a", "b"])
    late = _instances(recorder, ["late"])
    assert late["late"] == first["a"]
    assert recorder.calls["work"].count("late") == 0 and recorder.calls["finalize"] != ["late"]


def test_a_new_submission_is_a_new_generation(recorder):
    _instances(recorder, ["a"], run="sub-1")
    again = _instances(recorder, ["a"], run="sub-2")
    assert again["a"].ok and len(recorder.calls["prepare"]) == 2 and len(recorder.calls["finalize"]) == 2


def test_a_prepare_failure_reaches_every_instance(tmp_path):
    recorder = Recorder(tmp_path, prepare_error=InputError("bad row", where="input.jsonl:3"))
    t0 = time.monotonic()
    results = _instances(recorder, ["a", "b", "c"])
    assert time.monotonic() - t0 < FAST.wait_timeout_secs
    assert len(recorder.calls["prepare"]) == 1 and recorder.calls["work"] == []
    assert all(type(e) is InputError for e in results.values())
    assert len({str(e) for e in results.values()}) == 1 and "input.jsonl:3: bad row" in str(results["a"])


def test_a_terminal_shard_failure_stops_every_instance_with_one_message(tmp_path):
    def run(task):
        if task.shard_id == "part-00001-of-00004":
            raise RuntimeError("poison row")
        time.sleep(0.3)
        return copy_runner()(task)

    recorder = Recorder(tmp_path, run_shard=run)
    results = _instances(recorder, ["a", "b", "c"])
    assert all(type(e) is ShardFailedError for e in results.values()), results
    assert len({str(e) for e in results.values()}) == 1 and "part-00001-of-00004: poison row" in str(results["a"])
    assert recorder.calls["finalize"] == [] and not recorder.output.exists()


def test_strict_mode_passes_when_every_node_takes_its_share(tmp_path):
    recorder = Recorder(tmp_path, num_shards=4)
    strict = StrictPolicy(nodes=2, share_per_slot=2, slots=1)
    results = _instances(recorder, ["a", "b"], flow={"strict": strict})
    assert all(o.ok for o in results.values()), results
    assert results["a"].details["nodes"] == {"a": 2, "b": 2}


def test_strict_mode_with_a_missing_node_fails_after_the_wait_timeout(tmp_path):
    recorder = Recorder(tmp_path, num_shards=3)
    strict = StrictPolicy(nodes=3, share_per_slot=1, slots=1)
    t0 = time.monotonic()
    results = _instances(recorder, ["a", "b"], flow={"strict": strict})
    elapsed = time.monotonic() - t0
    assert FAST.wait_timeout_secs <= elapsed < FAST.wait_timeout_secs + 5
    assert all(type(e) is ParticipationError for e in results.values()), results
    message = str(results["a"])
    assert message == str(results["b"])
    assert "only 2 of 3 node(s) joined" in message and "1 node(s) missing" in message
    assert recorder.calls["finalize"] == []


@pytest.mark.parametrize("with_user_cap", [True, False])
def test_user_max_shards_leaves_the_rest_to_others(tmp_path, with_user_cap):
    recorder = Recorder(tmp_path, num_shards=4)
    c = coordinator(recorder.job, "capped")
    c.join()
    base = recorder.phases("capped")

    def capped_work(stop, max_done):
        summary = base.work(stop, max_done)
        summary.stop_reason, summary.complete = "max_shards", False
        return summary

    phases = base.__class__(base.prepare, base.check_prepared, capped_work, base.finalize)
    result = run_coordinated(c, phases, wait_timeout_secs=FAST.wait_timeout_secs, user_cap=with_user_cap)
    assert (result is None) == with_user_cap
