"""WarmRayRuntime attach paths: fail fast and clearly, never hang.

Each test runs in a child interpreter of its own: WarmRayRuntime reuses a runtime its
process is already connected to, and the test process may hold the folder's shared one.
"""

from __future__ import annotations

import functools
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from data_juicer_elastic.errors import ConfigError, ElasticError
from data_juicer_elastic.execution.ray_runtime import WarmRayRuntime

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[2]
_CHILD = """
import sys, pytest
from tests.execution import test_ray_runtime as module
try:
    getattr(module, sys.argv[1]).__wrapped__()
except pytest.skip.Exception as exc:
    print("SKIPPED:", exc.msg)
"""


def in_a_fresh_process(test):
    @functools.wraps(test)
    def run_in_child():
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, test.__name__], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        if "SKIPPED:" in proc.stdout:
            pytest.skip(proc.stdout.split("SKIPPED:", 1)[1].strip())

    return run_in_child


@in_a_fresh_process
def test_auto_without_a_cluster_fails_fast():
    from ray._private import services

    services.find_gcs_addresses.cache_clear()
    if services.find_gcs_addresses():
        pytest.skip("another Ray runtime runs on this node: 'auto' would attach to it")
    t0 = time.monotonic()
    with pytest.raises(ElasticError) as info:
        WarmRayRuntime("auto").start()
    assert time.monotonic() - t0 < 10
    assert "no running Ray runtime was found" in str(info.value)
    assert info.value.where == "ray_address=auto"


@in_a_fresh_process
def test_dead_address_fails_at_once():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ElasticError) as info:
        WarmRayRuntime(f"127.0.0.1:{port}", connect_timeout_secs=5).start()
    assert time.monotonic() - t0 < 5
    assert f"127.0.0.1:{port}" in str(info.value)


@in_a_fresh_process
def test_address_that_never_answers_fails_within_the_timeout():
    """A TCP listener that is not Ray: ray.init would wait for minutes; the child probe is killed."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port = server.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(ElasticError) as info:
            WarmRayRuntime(f"127.0.0.1:{port}", connect_timeout_secs=6).start()
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        server.close()
    assert elapsed < 6 + 5, elapsed
    assert "timed out after 6s" in str(info.value) or "could not connect to Ray" in str(info.value)


@in_a_fresh_process
def test_malformed_address_is_a_config_error():
    with pytest.raises(ConfigError):
        WarmRayRuntime("no-port-here").start()
    with pytest.raises(ConfigError):
        WarmRayRuntime("local", num_cpus=0)
