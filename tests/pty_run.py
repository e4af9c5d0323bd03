"""Run a real command on a pseudo-terminal, as a user's terminal runs it, and keep what it drew."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

CLEAR_LINE = "\r\x1b[K"


def run_on_terminal(
    cmd: list[str], *, cwd: Path, env: dict | None = None, columns: int = 120, timeout: float = 600
) -> subprocess.CompletedProcess:
    """stdin, stdout and stderr are one pty of ``columns`` columns; ``stdout`` is everything drawn."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    full_env = {**os.environ, "TERM": "xterm", **(env or {})}
    proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    drawn = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the last holder of the terminal closed it
                    break
                if not data:
                    break
                drawn += data
            elif proc.poll() is not None:
                break
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        os.close(master)
    return subprocess.CompletedProcess(cmd, proc.returncode, drawn.decode("utf-8", "replace"), "")


def scrolled_lines(drawn: str) -> list[str]:
    """The lines that stayed on the screen, without the live line's redraws."""
    lines = []
    for line in drawn.replace("\r\n", "\n").split("\n"):
        kept = line.split(CLEAR_LINE)[-1].strip()  # what a redraw left, if it ended this line
        if kept:
            lines.append(kept)
    return lines


def redraws(drawn: str) -> list[str]:
    """Every state the live line was drawn in."""
    return [part.split("\n")[0].strip() for part in drawn.split(CLEAR_LINE)[1:] if part.split("\n")[0].strip()]
