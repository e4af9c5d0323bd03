"""One warm node-local Ray runtime per worker process, reused for every shard (docs/multinode.md,
"Ray per node"): ``local`` starts a private one (``ray.init("local")`` never attaches to another
job's); ``auto`` or an address attaches, probed first in a child process that can be killed (an
in-process ``ray.init`` against a dead address can hang for minutes).  Ray is imported only when a
runtime starts.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.compat import ray_internals
from data_juicer_elastic.errors import ConfigError, RayConnectionError, last_line
from data_juicer_elastic.jobdir.worker import is_guard_handler

LOCAL: Final = "local"
AUTO: Final = "auto"
DEFAULT_CONNECT_TIMEOUT_SECS: Final = 30.0
_TCP_TIMEOUT_SECS: Final = 3.0
# A local raylet prestarts one worker per CPU with an empty runtime env; this job's runtime env
# (env vars, setup hook) differs, so Ray never gives them a task and kills them later: on the demo
# two processes importing Ray for nothing, competing with the ones the first shard waits for.
_LOCAL_SYSTEM_CONFIG: Final = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}

# Run in a child process: connect, print the GCS address, disconnect.  Output is
# on the last stdout line so Ray's own chatter does not matter.
_PROBE: Final = """
import sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, namespace="dj-elastic-probe")
alive = [n for n in ray.nodes() if n.get("Alive")]
here = ray.util.get_node_ip_address()
local = any(n.get("NodeManagerAddress") == here for n in alive)
print(f"DJ_ELASTIC_TOPOLOGY={len(alive)},{int(local)}", flush=True)
print("DJ_ELASTIC_GCS=" + str(ray.get_runtime_context().gcs_address), flush=True)
ray.shutdown()
"""


class WarmRayRuntime:
    """Context manager owning (``local``) or attaching to (``auto``/address) Ray.

    ``runtime_env``: the job-level runtime env (env vars, custom operators' ``py_modules``).  The
    warm runtime must be started with it: Ray ignores the ``runtime_env`` Data-Juicer's
    ``initialize_ray`` passes once this process is connected."""

    def __init__(
        self,
        address: str = LOCAL,
        num_cpus: int | None = None,
        *,
        runtime_env: dict[str, Any] | None = None,
        connect_timeout_secs: float = DEFAULT_CONNECT_TIMEOUT_SECS,
    ):
        if not isinstance(address, str) or not address.strip():
            raise ConfigError(f"invalid Ray address {address!r}", where="elastic.ray_address", hint="use 'local'")
        if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1):
            raise ConfigError(f"invalid num_cpus {num_cpus!r}", where="elastic.ray_num_cpus", hint="an integer >= 1")
        if connect_timeout_secs <= 0:
            raise ConfigError(f"invalid connect timeout {connect_timeout_secs!r}", where="WarmRayRuntime")
        self.address = address.strip()
        self.num_cpus = num_cpus
        self.runtime_env = runtime_env
        self.connect_timeout_secs = float(connect_timeout_secs)
        self.namespace = f"dj-elastic-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.gcs_address: str | None = None
        self.start_secs: float | None = None
        self._owned = False  # True when this object called ray.init and must call ray.shutdown

    def __enter__(self) -> WarmRayRuntime:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def owned(self) -> bool:
        """Whether ``close()`` will disconnect (and, for ``local``, stop) Ray."""
        return self._owned

    def start(self) -> None:
        """Start or attach; idempotent.  Raises ElasticError instead of hanging."""
        if self.gcs_address is not None:
            return
        import ray

        t0 = time.monotonic()
        if ray.is_initialized():
            # Someone in this process already connected (a test fixture, an
            # embedding application): reuse it and leave it to its owner.
            self.gcs_address = ray.get_runtime_context().gcs_address
            logger.info(f"reusing the Ray runtime this process is already connected to ({self.gcs_address})")
            self.start_secs = 0.0
            return
        if self.address == LOCAL:
            self._init(
                ray, address=LOCAL, include_dashboard=False, num_cpus=self.num_cpus, _system_config=_LOCAL_SYSTEM_CONFIG
            )
        else:
            if self.num_cpus is not None:
                logger.warning(f"ray_num_cpus={self.num_cpus} is ignored when attaching to Ray at {self.address!r}")
            target = self._probe()
            self._init(ray, address=target)
        self._owned = True
        self.gcs_address = ray.get_runtime_context().gcs_address
        self.start_secs = time.monotonic() - t0
        logger.info(
            f"Ray runtime ready at {self.gcs_address} ({'started' if self.address == LOCAL else 'attached'} "
            f"in {self.start_secs:.1f}s, namespace {self.namespace})"
        )

    def close(self) -> None:
        """Disconnect; stops the runtime only when this object started it."""
        try:
            if self._owned:
                import ray

                ray.shutdown()
        except Exception as exc:  # noqa: BLE001 - shutting down must not mask the caller's error
            logger.warning(f"ray.shutdown() failed: {exc!r}")
        finally:
            self._owned = False
            self.gcs_address = None

    @property
    def started(self) -> bool:
        return self.gcs_address is not None

    def ping(self, timeout_secs: float) -> bool:
        """Whether the runtime runs a zero-CPU task within ``timeout_secs`` (GCS, raylet and a
        worker process all answer).  Call it from a thread of its own: with the runtime frozen
        even submitting can block."""
        import ray

        try:
            ray.get(_ping_task().remote(), timeout=timeout_secs)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure to answer is "no sign of life"
            logger.debug(f"Ray probe did not answer: {type(exc).__name__}: {exc}")
            return False

    def abort(self) -> None:
        """Kill a runtime this object started that no longer answers (SIGKILL: its processes
        may be stopped, and a stopped process never handles SIGTERM).  Nothing else: this
        process is restarted next (``runtime_watch``), since calls blocked in the dead runtime
        cannot be unwound safely.  An attached runtime is not ours to kill."""
        if self._owned and self.address == LOCAL:
            _kill_node_processes()

    def _init(self, ray: Any, **kwargs: Any) -> None:
        # ray.init installs a SIGTERM handler (sys.exit) in the main thread, here and again
        # whenever Data-Juicer's RayExecutor calls it for a shard: the worker loop's own
        # handler (it releases the claims, then dies by the signal) must stay in force.
        ray_internals.keep_handlers(is_guard_handler)
        try:
            ray.init(namespace=self.namespace, runtime_env=self.runtime_env, log_to_driver=True, **kwargs)
        except Exception as exc:
            raise RayConnectionError(
                f"could not start or connect to Ray: {last_line(str(exc)) or exc.__class__.__name__}",
                where=f"ray_address={self.address}",
                hint="check `ray status` on this node, or use ray_address 'local'",
            ) from exc

    def _probe(self) -> str:
        """Find and test the target runtime without risking a hang in this process."""
        address = self.address
        if address == AUTO:
            address = _resolve_auto()
        host_port = address[len("ray://") :] if address.startswith("ray://") else address
        host, _, port = host_port.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                f"invalid Ray address {self.address!r}",
                where="elastic.ray_address",
                hint="use 'local', 'auto', host:port or ray://host:port",
            )
        _check_tcp(host, int(port), min(_TCP_TIMEOUT_SECS, self.connect_timeout_secs), self.address)
        return _probe_in_child(address, self.connect_timeout_secs, self.address)


def _resolve_auto() -> str:
    """What ``ray.init("auto")`` would connect to, or a fast, clear error."""
    try:
        found = ray_internals.canonical_address(AUTO)  # None: Ray moved it, let the child probe tell
    except ConnectionError as exc:
        raise RayConnectionError(
            "ray_address is 'auto' but no running Ray runtime was found on this node",
            where="ray_address=auto",
            hint="start one with `ray start --head`, set RAY_ADDRESS, or use ray_address 'local'",
        ) from exc
    return found or AUTO


def _check_tcp(host: str, port: int, timeout: float, shown: str) -> None:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise RayConnectionError(
            f"nothing accepts connections at {host}:{port} ({exc.strerror or exc.__class__.__name__})",
            where=f"ray_address={shown}",
            hint="check that the Ray head is running and the address is right, or use ray_address 'local'",
        ) from exc


def _probe_in_child(address: str, timeout: float, shown: str) -> str:
    # A new session so the whole child group (Ray may spawn helpers) can be
    # killed on timeout; SIGKILL because a stuck ray.init ignores SIGTERM.
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROBE, address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RayConnectionError(
            f"connecting to Ray timed out after {timeout:.0f}s",
            where=f"ray_address={shown}",
            hint="is this a Ray GCS address, and does RAY_AUTH_MODE / the auth token match the cluster's?",
        ) from None
    lines = out.splitlines() if proc.returncode == 0 else []
    for line in lines:
        if line.startswith("DJ_ELASTIC_TOPOLOGY="):
            nodes, local = line.split("=", 1)[1].split(",")
            check_topology(shown, int(nodes), local == "1")
    gcs = [line.split("=", 1)[1] for line in lines if line.startswith("DJ_ELASTIC_GCS=")]
    if gcs:
        return address if address.startswith("ray://") else gcs[-1]
    raise RayConnectionError(
        f"could not connect to Ray: {last_line(err) or f'probe exited with {proc.returncode}'}",
        where=f"ray_address={shown}",
        hint="check `ray status` on this node, or use ray_address 'local'",
    )


def check_topology(shown: str, nodes: int, includes_this_node: bool) -> None:
    """Refuse a runtime that is not this node's own (docs/multinode.md, "Ray per node"): ``auto``
    can name a cluster someone else started, and attaching would run this node's shards elsewhere."""
    if nodes <= 1 and includes_this_node:
        return
    what = f"a Ray cluster of {nodes} nodes" if nodes > 1 else "a Ray runtime on another machine"
    if shown != AUTO:  # an explicit address is the user's choice: allowed, but said out loud
        logger.warning(f"ray_address={shown} is {what}; elastic workers are meant to use node-local Ray")
        return
    raise RayConnectionError(
        f"ray_address 'auto' found {what}, not a runtime of this node only",
        where="ray_address=auto",
        hint="run `ray start --head` on this node (and unset RAY_ADDRESS), or use ray_address 'local'",
    )


@functools.cache
def _ping_task() -> Any:
    import ray

    @ray.remote(num_cpus=0, max_retries=0)
    def dj_elastic_ping() -> int:
        return os.getpid()

    return dj_elastic_ping


def _kill_node_processes() -> None:
    """SIGKILL every process of the local Ray node this process started (GCS, raylet, their workers)."""
    import psutil

    victims = []
    for pid in ray_internals.node_process_ids():
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            victims += [root, *root.children(recursive=True)]
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(victims, timeout=10)
    logger.warning(f"killed the {len(victims)} process(es) of the unresponsive Ray runtime")
