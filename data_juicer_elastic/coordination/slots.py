"""Several claim slots on one node: the instance runs slot 0, slots 1..S-1 are ``dj-elastic worker
--no-wait`` children with the same node id, each with its own warm Ray runtime and GPU subset.
Why processes, not threads: docs/multinode.md, "Several slots per node".
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from loguru import logger

from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.sharedfs.identity import NODE_ID_ENV

CUDA_ENV: Final = "CUDA_VISIBLE_DEVICES"
_PR_SET_PDEATHSIG: Final = 1


def slot_devices(visible: str | None, slots: int) -> list[str | None]:
    """Each slot's ``CUDA_VISIBLE_DEVICES``: contiguous, near-equal subsets of the listed devices;
    None for every slot when no devices are listed (CPU slots, or the variable unset)."""
    if slots < 1:
        raise ConfigError(f"invalid value {slots!r}: must be >= 1", where="elastic.slots_per_node")
    devices = [d.strip() for d in (visible or "").split(",") if d.strip()]
    if not devices or devices == ["-1"] or visible in ("NoDevFiles", "none"):
        return [None] * slots
    if len(devices) < slots:
        raise ConfigError(
            f"{slots} slots but only {len(devices)} GPU(s) listed in {CUDA_ENV}={visible}",
            where="elastic.slots_per_node",
            hint=f"use at most {len(devices)} slots, or list more devices",
        )
    base, extra = divmod(len(devices), slots)
    starts = [k * base + min(k, extra) for k in range(slots + 1)]  # the first `extra` slots get one more
    return [",".join(devices[starts[k] : starts[k + 1]]) for k in range(slots)]


def slot_cpus(ray_num_cpus: int | None, slots: int, cpu_count: int | None = None) -> int | None:
    """CPUs of each slot's local runtime: the setting as given (per slot), else the node's CPUs / slots."""
    if ray_num_cpus is not None or slots == 1:
        return ray_num_cpus
    return max(1, (cpu_count or os.cpu_count() or 1) // slots)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # A slot must not outlive its instance (e.g. the instance was SIGKILLed by a scheduler).
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class SlotPool:
    """Child slot processes of one instance."""

    procs: dict[int, subprocess.Popen] = field(default_factory=dict)
    logs: dict[int, IO[bytes]] = field(default_factory=dict)

    def start(self, slot: int, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")
        self.logs[slot] = log
        self.procs[slot] = subprocess.Popen(
            list(argv), env=dict(env), stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        logger.info(f"slot {slot}: started pid {self.procs[slot].pid} (log {log_path})")

    def stop(self) -> None:
        """SIGTERM every running slot: each releases its claim at once (the worker loop's signal path)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def wait(self) -> None:
        for slot, proc in self.procs.items():
            if (code := proc.wait()) != 0:
                logger.warning(f"slot {slot} (pid {proc.pid}) exited with {code}; see its log")
        for log in self.logs.values():
            log.close()

    def __enter__(self) -> SlotPool:
        return self

    def __exit__(self, exc_type, *rest: object) -> None:
        if exc_type is not None:
            self.stop()
        self.wait()


def slot_argv(job_dir: Path, setting_options: Sequence[str], max_done: int | None = None) -> list[str]:
    """A slot process's ``dj-elastic worker`` command line: it exits when nothing is left to claim
    (``--no-wait``), is one slot whatever ``slots_per_node`` the job recorded (``--slots 1``), takes
    the instance's settings as ``setting_options`` (``cli_options.setting_args`` over the worker's
    options, so every setting a worker has reaches it) and strict mode's share ``max_done``."""
    argv = [sys.executable, "-m", "data_juicer_elastic.cli", "worker", "--job-dir", str(job_dir), "--no-wait"]
    argv += ["--slots", "1", *setting_options]
    if max_done is not None:
        argv += ["--max-done", str(max_done)]
    return argv


def slot_env(node_id: str, devices: str | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env[NODE_ID_ENV] = node_id  # the same node identity as the instance: strict mode counts nodes
    if devices is not None:
        env[CUDA_ENV] = devices
    return env
