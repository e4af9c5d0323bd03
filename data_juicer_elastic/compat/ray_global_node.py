"""Ray 2.60: the processes of the local Ray node this process started
(``ray._private.worker._global_node.all_processes``): an unresponsive node-local runtime must be
killed for good (``execution.ray_runtime``); ``ray.shutdown`` can hang on it, and Ray has no public handle.
"""

from __future__ import annotations

from typing import Final

from data_juicer_elastic.compat import import_target, ray_moved

MODULE: Final = "ray._private.worker"
TARGET: Final = f"{MODULE}._global_node.all_processes"


def node_process_ids() -> list[int]:
    """The pids of the node processes (GCS, raylet, ...) this process started; [] when none."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    return [info.process.pid for infos in getattr(node, "all_processes", {}).values() for info in infos]


def self_check() -> str:
    worker = import_target(MODULE, where="ray")
    if not hasattr(worker, "_global_node"):
        raise ray_moved(f"{MODULE}._global_node is missing", where=TARGET)
    from ray._private.node import Node

    if "all_processes" not in Node.__init__.__code__.co_names:
        raise ray_moved(f"{TARGET}: ray._private.node.Node no longer sets all_processes", where=TARGET)
    return f"{TARGET} found"
