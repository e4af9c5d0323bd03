"""Real filesystems for fault tests: a command in its own mount namespace, with a tiny tmpfs (a
full disk) or a read-only bind mount where its paths are.

Root gets a private mount namespace (``unshare --mount``); anyone else a user namespace mapped
to root (``unshare --user --map-root-user --mount``), where an unprivileged user may mount
tmpfs and bind mounts.  :func:`mount_prefix` is None where neither is permitted: the tests
that need it are skipped.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from .commands import env
from .conftest import REPO


@functools.cache
def mount_prefix() -> tuple[str, ...] | None:
    """The argv prefix of a shell that may mount, or None."""
    if shutil.which("unshare") is None:
        return None
    options = [("--mount",), ("--user", "--map-root-user", "--mount")]
    if os.geteuid() != 0:
        options = options[1:]
    for flags in options:
        prefix = ("unshare", *flags, "--propagation", "private", "sh", "-c")
        probe = 'd=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs "$d" && umount "$d"; rc=$?; rmdir "$d"; exit $rc'
        if subprocess.run([*prefix, probe], capture_output=True, timeout=30).returncode == 0:
            return prefix
    return None


def tmpfs(path: Path, size: str) -> str:
    """A shell step: a tmpfs of ``size`` (e.g. ``256k``) at ``path`` (created if missing)."""
    return f"mkdir -p {shlex.quote(str(path))} && mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(path))}"


def read_only(path: Path) -> str:
    """A shell step: ``path`` bound onto itself read-only."""
    q = shlex.quote(str(path))
    return f"mount --bind {q} {q} && mount -o remount,bind,ro {q}"


def fill(path: Path, leave_kib: int = 0) -> str:
    """A shell step: fill the filesystem holding ``path`` until ``leave_kib`` KiB are free."""
    filler = shlex.quote(str(path / ".filler"))
    free = f"$(( $(df -k --output=avail {shlex.quote(str(path))} | tail -1) - {leave_kib} ))"
    return f'n={free}; if [ $n -gt 0 ]; then head -c "${{n}}k" /dev/zero > {filler} 2>/dev/null; fi; true'


def fill_when(trigger: Path, path: Path, leave_kib: int = 0) -> str:
    """A shell step: in the background, fill the filesystem holding ``path`` once ``trigger``
    exists (a run reached that point), leaving ``leave_kib`` KiB free."""
    wait = f"while [ ! -e {shlex.quote(str(trigger))} ]; do sleep 0.1; done"
    return f"( {wait}; {fill(path, leave_kib)} ) &"


def run_mounted(steps: list[str], argv: list[str], *, timeout: float = 300, extra_env: dict | None = None):
    """``argv`` (a command of this checkout) after the mount ``steps``, in a namespace of its own."""
    prefix = mount_prefix()
    assert prefix is not None, "check mount_prefix() first"
    script = " ".join(step if step.endswith("&") else step + " &&" for step in steps) + " exec " + shlex.join(argv)
    return subprocess.run(
        [*prefix, script], cwd=REPO, env=env(extra_env), capture_output=True, text=True, timeout=timeout
    )
