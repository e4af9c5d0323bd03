"""compat.ray_internals: Ray's node, SIGTERM handler, live execution metrics and block
concatenation; each check passes against the installed Ray and a moved internal names itself."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pyarrow as pa
import pytest

from data_juicer_elastic.compat import ray_internals


def struct_blocks() -> list[pa.Table]:
    # What Ray makes of an operator's output: batch 1 never has meta.extra, batch 2 does.
    first = pa.table({"meta": pa.array([{"n": 1, "extra": None}])})
    second = pa.table({"meta": pa.array([{"n": 2, "extra": {"x": "y"}}])})
    assert pa.types.is_null(first.schema.field("meta").type.field("extra").type)
    return [first, second]


def mixed_blocks() -> list[pa.Table]:
    # A column mixing JSON types, re-typed per batch: only ints here, only bools there, objects elsewhere.
    from ray.data.extensions import ArrowPythonObjectArray

    return [
        pa.table({"mix": pa.array([1, 2]), "n": [0, 1]}),
        pa.table({"mix": pa.array([True]), "n": [2]}),
        pa.table({"mix": ArrowPythonObjectArray.from_objects(["x", {"o": 1}]), "n": [3, 4]}),
        pa.table({"mix": pa.array([{"o": 2}]), "n": [5]}),
    ]


def test_the_targets_are_where_this_ray_has_them():
    assert "found" in ray_internals.check_ray_concat()


def test_ray_alone_fails_and_the_fixes_concatenate(monkeypatch):
    from ray.data._internal.arrow_ops import transform_pyarrow as tp

    for name in ray_internals.CONCAT_TARGETS:
        function = getattr(tp, name)
        monkeypatch.setattr(tp, name, getattr(function, "__wrapped__", function))  # Ray's own
    with pytest.raises(TypeError, match="not iterable"):  # the bugs this module exists for
        tp.concat(struct_blocks(), promote_types=True)
    with pytest.raises(Exception, match="incompatible types"):
        tp.concat(mixed_blocks()[:2], promote_types=True)
    ints_bools_struct = [mixed_blocks()[i] for i in (0, 1, 3)]
    assert pa.types.is_struct(tp.unify_schemas([b.schema for b in ints_bools_struct]).field("mix").type)
    with pytest.raises(Exception, match="incompatible types"):  # Ray "unified" it to the struct
        tp.concat(ints_bools_struct, promote_types=True)

    ray_internals.install_concat_fixes()
    ray_internals.install_concat_fixes()  # idempotent
    merged = tp.concat(struct_blocks(), promote_types=True)
    assert merged.to_pylist() == [{"meta": {"n": 1, "extra": None}}, {"meta": {"n": 2, "extra": {"x": "y"}}}]
    mixed = tp.concat(mixed_blocks(), promote_types=True)
    assert mixed.column("mix").to_pylist() == [1, 2, True, "x", {"o": 1}, {"o": 2}]
    assert tp.concat(ints_bools_struct).column("mix").to_pylist() == [1, 2, True, {"o": 2}]
    assert mixed.column("n").to_pylist() == list(range(6)), "other columns and the row order are untouched"


def test_a_moved_target_is_one_integration_error(monkeypatch):
    from ray.data._internal.arrow_ops import transform_pyarrow

    from data_juicer_elastic.errors import IntegrationError

    monkeypatch.delattr(transform_pyarrow, "_backfill_missing_fields")
    with pytest.raises(IntegrationError, match="_backfill_missing_fields"):
        ray_internals.check_ray_concat()


def test_check_ray_concat():
    assert ray_internals.CONCAT_MODULE in ray_internals.check_ray_concat()


def test_check_ray_global_node():
    assert "_global_node.all_processes" in ray_internals.check_ray_global_node()


def test_a_process_that_started_no_node_has_no_node_processes():
    # In a fresh interpreter: a test before this one in this process may have started Ray.
    probe = "import ray\nfrom data_juicer_elastic.compat import ray_internals\nprint(ray_internals.node_process_ids())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_self_check_finds_the_worker_mode_of_this_driver():
    assert "found" in ray_internals.check_ray_worker_mode()
    assert ray_internals.is_ray_worker() is False


def test_a_process_whose_global_worker_is_in_worker_mode_is_a_worker(monkeypatch):
    worker = SimpleNamespace(WORKER_MODE=1, global_worker=SimpleNamespace(mode=1))
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(_private=SimpleNamespace(worker=worker)))
    assert ray_internals.is_ray_worker() is True
    worker.global_worker.mode = 0  # SCRIPT_MODE: a driver
    assert ray_internals.is_ray_worker() is False


def test_without_ray_imported_no_process_is_a_worker(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert ray_internals.is_ray_worker() is False


def test_check_ray_services():
    assert "canonicalize_bootstrap_address" in ray_internals.check_ray_services()


PROBE = """
import signal
import ray._private.utils as utils
from data_juicer_elastic.compat import ray_internals
from data_juicer_elastic.jobdir.worker import SignalGuard, is_guard_handler

def rays(signum, frame):
    raise SystemExit(signum)

print(ray_internals.keep_handlers(is_guard_handler), ray_internals.keep_handlers(is_guard_handler))
with SignalGuard() as guard:
    utils.set_sigterm_handler(rays)  # what every ray.init does
    print(is_guard_handler(signal.getsignal(signal.SIGTERM)))
utils.set_sigterm_handler(rays)  # no worker loop: Ray's handler, as without the plugin
print(signal.getsignal(signal.SIGTERM) is rays)
"""


def test_check_ray_sigterm_handler():
    assert "set_sigterm_handler" in ray_internals.check_ray_sigterm_handler()


def test_ray_leaves_the_worker_handler_and_only_it():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["applied", "already", "installed", "True", "True"]


def test_check_ray_map_batches():
    assert "ray.data.Dataset.map_batches" in ray_internals.check_ray_map_batches()


def test_the_swap_is_undone_after_the_block():
    from ray.data import Dataset

    original = Dataset.map_batches
    with ray_internals.map_batches_replaced(lambda found: "replacement"):
        assert Dataset.map_batches == "replacement"
    assert Dataset.map_batches is original


def test_check_ray_streaming_executor():
    assert "StreamingExecutor._topology" in ray_internals.check_ray_streaming_executor()


def test_no_execution_runs_here():
    assert ray_internals.live_executors() == []
