"""Who a worker is: node, host, kernel boot, pid namespace and pid.  Two nodes can share a hostname
and two containers a kernel, so no single field identifies a process: each claim records all of
them, and every attempt gets a fresh random id on top.
"""

from __future__ import annotations

import calendar
import contextlib
import hashlib
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Final

NODE_ID_ENV: Final = "DJ_ELASTIC_NODE_ID"
_BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
_PID_NS_PATH: Final = "/proc/self/ns/pid"
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_.\-]+")
_STAMP: Final = "%Y%m%dT%H%M%S"  # the start time that begins an attempt id (UTC; milliseconds follow)


@dataclass(frozen=True)
class WorkerIdentity:
    node_id: str
    hostname: str
    boot_id: str
    pid: int
    pid_namespace: str = ""
    """``pid:[4026531836]`` where /proc exposes it; pids only compare within one namespace."""

    @classmethod
    def current(cls, node_id: str | None = None) -> WorkerIdentity:
        hostname = socket.gethostname() or "unknown-host"
        node = node_id or os.environ.get(NODE_ID_ENV) or hostname
        return cls(
            node_id=node,
            hostname=hostname,
            boot_id=_read_boot_id(),
            pid=os.getpid(),
            pid_namespace=_read_pid_namespace(),
        )

    def new_attempt_id(self) -> str:
        """Unique, sortable by start time, filesystem-safe: ``20240101T120000123Z-node-1234-9f3a...``
        (:func:`attempt_started_at` reads the time back)."""
        now = time.time()
        stamp = time.strftime(_STAMP, time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}Z"
        return f"{stamp}-{safe_name(self.node_id)[:40]}-{self.pid}-{secrets.token_hex(6)}"

    def same_kernel_namespace(self, hostname: str, boot_id: str, pid_namespace: str) -> bool:
        """True when a pid recorded with these fields can be checked with ``os.kill`` from here: hosts
        share names, containers share a kernel but not a pid namespace, so all three must match and
        the namespace must be known."""
        return bool(
            self.pid_namespace
            and pid_namespace == self.pid_namespace
            and hostname == self.hostname
            and boot_id == self.boot_id
            and not boot_id.startswith("unknown-")
        )


def safe_name(value: str) -> str:
    """A node id as one path component: unsafe characters become ``_`` (readability, not identity)."""
    return _UNSAFE.sub("_", str(value)).strip("._-")[:80] or "node"


def kernel_tag(me: WorkerIdentity | None = None) -> str:
    """A short filename-safe tag of (hostname, boot id, pid namespace): names a file whose pid only
    this kernel namespace can check.  Empty when the namespace is unknown (nobody may judge)."""
    me = me or WorkerIdentity.current()
    if not me.same_kernel_namespace(me.hostname, me.boot_id, me.pid_namespace):
        return ""
    return hashlib.sha256(f"{me.hostname}|{me.boot_id}|{me.pid_namespace}".encode()).hexdigest()[:12]


def pid_alive(pid: int) -> bool:
    """False only when the kernel says the pid does not exist (ESRCH); errs on 'alive'."""
    if pid <= 0:
        return True  # never signal process groups; an odd pid is not evidence of death
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, owned by someone else
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A killed process whose parent has not reaped it yet still answers kill(0): it is dead."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return False
    # "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ")".
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] == "Z"


def _read_boot_id() -> str:
    with contextlib.suppress(OSError), open(_BOOT_ID_PATH, encoding="ascii") as handle:
        if value := handle.read().strip():
            return value
    # Without a boot id the same-host liveness shortcut is disabled (see same_kernel_namespace).
    return f"unknown-{secrets.token_hex(8)}"


def _read_pid_namespace() -> str:
    try:
        return os.readlink(_PID_NS_PATH)
    except OSError:
        return ""


def attempt_started_at(attempt_id: str | None) -> float | None:
    """When an attempt started, from its id (:meth:`WorkerIdentity.new_attempt_id`: UTC, milliseconds)."""
    if not attempt_id or len(attempt_id) < 19 or attempt_id[18] != "Z":
        return None
    try:
        return calendar.timegm(time.strptime(attempt_id[:15], _STAMP)) + int(attempt_id[15:18]) / 1000
    except ValueError:
        return None
