"""One warm node-local Ray runtime per worker process, reused for every shard (docs/multinode.md,
"Ray per node"): ``local`` starts a private one (``ray.init("local")`` never attaches to another
job's); ``auto`` or an address attaches, probed first in a child process that can be killed (an
in-process ``ray.init`` against a dead address can hang for minutes).  Ray is imported only when a
runtime starts.

:class:`RuntimeWatch` is the Ray runner's half of the stall rule (``jobdir.heartbeats``): probe the
runtime while a shard's progress is quiet, and restart the worker when the shard was given up.
Rules, and why a restart is a new process and not a new runtime: docs/failure-semantics.md, "A
heartbeat means progress".  :class:`LazyShardRunner` starts the runtime when the worker is about to
claim: a worker with nothing to claim costs no Ray start, and one that fails while Ray starts, or runs
other operator code (``code_fingerprint``), holds no claim.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from loguru import logger

from data_juicer_elastic.compat import ray_internals
from data_juicer_elastic.dedup.stages import DedupStage
from data_juicer_elastic.errors import EXIT_ERROR, ConfigError, RayConnectionError, last_line
from data_juicer_elastic.execution.code_fingerprint import check_code, code_fingerprint
from data_juicer_elastic.execution.shard_runner import ShardRunner, shard_runtime_env
from data_juicer_elastic.jobdir import heartbeats
from data_juicer_elastic.jobdir.attempts import ShardOutput, ShardTask, SignatureOutput, SignatureTask
from data_juicer_elastic.jobdir.heartbeats import Liveness
from data_juicer_elastic.jobdir.worker import is_guard_handler
from data_juicer_elastic.rows.shard_source import ShardSource
from data_juicer_elastic.settings import DEFAULT_MAX_ERROR_ROWS

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
        process is restarted next (:class:`RuntimeWatch`), since calls blocked in the dead runtime
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


QUIET_FRACTION: Final = 0.25  # probe once the attempt was quiet for this part of the stall timeout
MIN_TICK_SECS: Final = 0.5
RESTARTS_ENV: Final = "DJ_ELASTIC_RUNTIME_RESTARTS"  # restarts so far of this worker (kept across exec)
MAX_RESTARTS: Final = 5  # then the worker stops (exit 2): a node whose runtime keeps freezing is broken


class RuntimeWatch:
    """Context manager around one attempt of the Ray runner; a no-op without a liveness.
    ``restart_process()`` replaces this process after the frozen runtime was killed."""

    def __init__(
        self, runtime: WarmRayRuntime, liveness: Liveness | None, restart_process: Callable[[], object] | None = None
    ):
        self.runtime, self.liveness = runtime, liveness
        self.restart_process = restart_process or restart_worker_process
        self._probing = threading.Lock()
        # probes once the attempt was quiet for part of the stall timeout, looking a few times meanwhile
        self.quiet_secs = liveness.stall_secs * QUIET_FRACTION if liveness is not None else 0.0
        tick = max(MIN_TICK_SECS, self.quiet_secs / 4)
        self._thread = heartbeats.PeriodicThread(tick, self._tick, "dj-elastic-runtime-watch", join_secs=5)

    def __enter__(self) -> RuntimeWatch:
        if self.liveness is not None:
            self.liveness.when_stalled(self.restart)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._thread.stop()

    def restart(self) -> None:
        """The shard was given up (heartbeat thread): kill the runtime, start the worker afresh."""
        self._thread.stop()
        logger.error("the shard's Ray runtime stopped answering: killing it and restarting the worker")
        self.runtime.abort()
        self.restart_process()

    def _tick(self) -> None:
        assert self.liveness is not None
        if self.liveness.quiet_for() >= self.quiet_secs and self._probing.acquire(blocking=False):
            threading.Thread(target=self._probe, name="dj-elastic-runtime-probe", daemon=True).start()

    def _probe(self) -> None:
        try:
            assert self.liveness is not None
            if self.runtime.started and self.runtime.ping(self.liveness.stall_secs):
                self.liveness.note("the Ray runtime answered a probe")
        finally:
            self._probing.release()


def restart_worker_process(before: Callable[[], object] | None = None) -> None:
    """Replace this process with a fresh run of its own command line (same pid, same
    environment), or stop it (exit 2) after :data:`MAX_RESTARTS` restarts."""
    count = int(os.environ.get(RESTARTS_ENV, "0") or 0) + 1
    if before is not None:
        try:
            before()
        except Exception as exc:  # noqa: BLE001 - the restart matters more
            logger.warning(f"before restarting: {exc}")
    if count > MAX_RESTARTS:
        print(
            f"error: the Ray runtime of this worker froze {count} times; its shards were given up "
            "(check the node: memory, disk, a hung GPU), then start the worker again",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_ERROR)
    os.environ[RESTARTS_ENV] = str(count)
    argv = list(sys.orig_argv)
    logger.error(f"restarting this worker ({count}/{MAX_RESTARTS}) with a fresh Ray runtime: {' '.join(argv)}")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os.execv(sys.executable, argv)


class LazyShardRunner:
    """Context manager and ``run_shard`` callable; closing stops the runtime it started.  ``code``: the
    job's code fingerprint, checked before each runtime start (None: not checked)."""

    def __init__(
        self,
        recipe: dict[str, Any],
        expected_stage_identities: list[str],
        cache_dir: Path,
        *,
        row_schema: list[Any] | None | Callable[[], list[Any] | None],
        ray_address: str = LOCAL,
        ray_num_cpus: int | None = None,
        code: dict[str, Any] | None = None,
        allow_version_mismatch: bool = False,
        restart_process: Callable[[], object] | None = None,
        max_error_rows: float = DEFAULT_MAX_ERROR_ROWS,
        stages: list[DedupStage] | None = None,
    ):
        self._recipe, self._code, self._allow_versions = recipe, code, allow_version_mismatch
        self._restart_process = restart_process
        self._starting = threading.Lock()  # one start at a time: early, or before a claim
        self._closed = threading.Event()  # ends the thread that started the runtime early
        self._runner = ShardRunner(
            recipe,
            expected_stage_identities,
            cache_dir,
            row_schema=row_schema,
            max_error_rows=max_error_rows,
            stages=stages,
        )
        self.runtime = WarmRayRuntime(ray_address, ray_num_cpus, runtime_env=shard_runtime_env(recipe, Path(cache_dir)))

    @property
    def starting(self) -> bool:
        return self._starting.locked() and not self.runtime.started

    def __enter__(self) -> LazyShardRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def ready(self) -> bool:
        """Check the code and start the runtime unless running (waiting for a start under way);
        True when it had to: that took seconds, the caller looks at its shard again.  Raises
        ElasticError (CodeMismatchError, RayConnectionError) rather than claiming or hanging."""
        with self._starting:
            if self.runtime.started:
                return False
            if self._code is not None:
                here = code_fingerprint(self._recipe)
                check_code(self._code, here, allow_version_mismatch=self._allow_versions)
            self.runtime.start()
            return True

    def start_early(self) -> None:
        """Start the runtime on a thread now (while the job is scanned), so the first shard does
        not wait for it.  A failure is only logged here: :meth:`ready`, called before the first
        claim, tries again and raises it.  The thread lives until :meth:`close`: Ray's node
        processes are started with a parent-death signal, which Linux sends when the *thread*
        that started them ends (seen with Ray 2.60: the runtime died a minute after its
        starting thread returned)."""

        def start() -> None:
            try:
                self.ready()
            except Exception as exc:  # noqa: BLE001 - ready() raises it again where it matters
                logger.warning(f"starting Ray early failed ({type(exc).__name__}: {exc}); tried again before a claim")
                return
            self._closed.wait()

        threading.Thread(target=start, name="dj-elastic-ray-start", daemon=True).start()

    def read_ahead(self, source: ShardSource) -> Any:
        return self._runner.read_ahead(source)

    def __call__(self, task: ShardTask) -> ShardOutput:
        return self._watched(self._runner, task)

    def signatures(self, task: SignatureTask) -> SignatureOutput:
        """A shard's signature phase of one dedup stage (``ShardRunner.signatures``), watched the same way."""
        return self._watched(self._runner.signatures, task)

    def _watched(self, run: Callable[[Any], Any], task: Any) -> Any:
        self.ready()  # idempotent; the worker loop normally did it before claiming
        tracker = heartbeats.current()  # the worker loop's live progress of this attempt, with its stall rule
        alive = tracker.liveness if tracker is not None else None
        with RuntimeWatch(self.runtime, alive, self._restart_process):
            return run(task)

    def close(self) -> None:
        try:
            self._runner.close()  # its warm actors live in the runtime: free them first
        finally:
            try:
                with self._starting:  # a start under way (start_early) ends first: ray.init is not interruptible
                    self.runtime.close()
            finally:
                self._closed.set()
