"""compat.ray_global_node: its self-check passes against the installed packages (an upgrade that
moves the internal fails here, naming it)."""

from __future__ import annotations

import subprocess
import sys

from data_juicer_elastic.compat import ray_global_node


def test_self_check():
    assert "_global_node.all_processes" in ray_global_node.self_check()


def test_a_process_that_started_no_node_has_no_node_processes():
    # In a fresh interpreter: a test before this one in this process may have started Ray.
    probe = (
        "import ray\nfrom data_juicer_elastic.compat import ray_global_node\nprint(ray_global_node.node_process_ids())"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
