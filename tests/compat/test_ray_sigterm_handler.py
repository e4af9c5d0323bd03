"""compat.ray_sigterm_handler: its self-check passes against the installed Ray, and Ray's own
installer leaves the worker's SIGTERM handler in place, and only that one (an upgrade that moves
the internal fails here, naming it).  A fresh interpreter: the patch is process-wide."""

from __future__ import annotations

import subprocess
import sys

from data_juicer_elastic.compat import ray_sigterm_handler

PROBE = """
import signal
import ray._private.utils as utils
from data_juicer_elastic.compat import ray_sigterm_handler
from data_juicer_elastic.jobdir.worker import SignalGuard, is_guard_handler

def rays(signum, frame):
    raise SystemExit(signum)

print(ray_sigterm_handler.keep_handlers(is_guard_handler), ray_sigterm_handler.keep_handlers(is_guard_handler))
with SignalGuard() as guard:
    utils.set_sigterm_handler(rays)  # what every ray.init does
    print(is_guard_handler(signal.getsignal(signal.SIGTERM)))
utils.set_sigterm_handler(rays)  # no worker loop: Ray's handler, as without the plugin
print(signal.getsignal(signal.SIGTERM) is rays)
"""


def test_self_check():
    assert "set_sigterm_handler" in ray_sigterm_handler.self_check()


def test_ray_leaves_the_worker_handler_and_only_it():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["applied", "already", "installed", "True", "True"]
