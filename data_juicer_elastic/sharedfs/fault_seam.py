"""The fault-injection seam every job-directory file operation passes through (unused, each call
costs a global load and an ``is None`` test): docs/failure-semantics.md, "Fault injection (for tests)".
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

FaultHook = Callable[[str, Path], None]
_fault_hook: FaultHook | None = None
_done_hook: FaultHook | None = None


def set_fault_hook(hook: FaultHook | None, after: FaultHook | None = None) -> None:
    """Install callables(op, path): ``hook`` runs before every operation, ``after`` after
    the mutating ones succeeded (create, write, fsync, close, link, rename, replace).
    Either may raise OSError or end the process; None removes them (tests, fault injection)."""
    global _fault_hook, _done_hook
    _fault_hook, _done_hook = hook, after


def fault_point(op: str, path: Path) -> None:
    if _fault_hook is not None:
        _fault_hook(op, Path(path))


def fault_done(op: str, path: Path) -> None:
    if _done_hook is not None:
        _done_hook(op, Path(path))


def named_os_error(exc: OSError, path: Path, what: str) -> OSError:
    """``exc`` with the path in its message: os.write/os.fsync/os.close errors name no file,
    and an ENOSPC that does not say where is of no use to whoever must free space."""
    return OSError(exc.errno, f"{what} failed: {exc.strerror}", str(path))
