"""Fault injection for tests of real processes: failing file operations and named crash points.

Test code only: the package holds the seam (``sharedfs.fault_seam``, two hooks, ``None``
unless a test sets them), this module builds the hooks (``fault_point`` before an operation,
``fault_done`` after it succeeded).  In-process a test uses :func:`injected`; a process a test
starts gets the plan its environment names from ``plan_hook/sitecustomize.py``, which the
test helpers put first on its ``PYTHONPATH`` (:func:`hooked_pythonpath`) and which calls
:func:`install_from_env` when the interpreter starts.  With neither variable set nothing is
installed and the hooks stay ``None``.

``DJ_ELASTIC_TEST_CRASH_AT=<point>[@N]`` makes the process SIGKILL itself at the
N-th (default first) time it reaches a named point:

========== ======================================================================
prepare    right after this preparer published the recipe (before the plan)
scan-claim right after this worker's claim of a shard's scan was published (``scans/claims/``)
scanned    right after this worker's scan result was published (``scans/done/<shard>``)
claim      right after this worker's claim was published (``claims/<shard>/gen-N``)
write      before writing a shard's output (``attempts/.../output.jsonl``)
fsync      before fsyncing a shard's output
done       before linking ``result.json`` to ``done/<shard>.json``
published  right after that link succeeded (done, but no release record yet)
merge      mid-merge, after a shard was copied into the export's temp file (streaming merge:
           into ``<export>.partial``, before its progress record says so)
finalize   after the merged temp file is complete, before the export path is published
========== ======================================================================

``<op>:<text>`` (e.g. ``write:.merged.jsonl.tmp``) is the raw form: the first
``fault_point`` ``<op>`` whose path contains ``<text>``.

``DJ_ELASTIC_TEST_FAULTS`` is a JSON list of :class:`FaultRule` objects, e.g.
``[{"op": "link", "path": "/done/", "errno": "EIO", "mode": "lie", "times": 1}]``:
``mode`` ``fail`` raises before the operation (it does not happen), ``lie`` lets it
happen and then raises (a retransmitted NFS call that "failed"), ``delay`` holds it back
``delay_secs`` and lets it happen (a slow round trip: ``{"op": "link", "path": "/claims/",
"mode": "delay", "delay_secs": 5}``; no errno; it logs ``fault injected: delaying <op> <path>``
first, so a test knows the process is inside it).  The error looks like the real call's:
open/create/link/rename/replace name the path, write/fsync/close do not (``fsio`` must add it).
"""

from __future__ import annotations

import errno as errno_module
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from loguru import logger

from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.sharedfs import fault_seam

CRASH_ENV: Final = "DJ_ELASTIC_TEST_CRASH_AT"
FAULTS_ENV: Final = "DJ_ELASTIC_TEST_FAULTS"
HOOK_DIR: Final = Path(__file__).resolve().parent / "plan_hook"  # its sitecustomize installs the plan
REPO: Final = Path(__file__).resolve().parents[2]  # the hook imports this module from here
FAULT_ERRNOS: Final = ("ENOSPC", "EDQUOT", "EIO", "ESTALE", "EACCES", "EPERM", "EROFS", "ETIMEDOUT", "EXDEV")
_UNNAMED_OPS: Final = frozenset({"write", "fsync", "close"})  # the real os.* call names no file

Phase = Literal["before", "after"]


@dataclass(frozen=True)
class CrashPoint:
    phase: Phase
    op: str
    text: str  # substring of the operation's path
    suffix: bool = False  # the path must end with ``text``
    not_in: tuple[str, ...] = ()  # ... and must hold none of these (a shard run's records, not a scan's
    # or the summary writer's lease: both use the same protocol, under scans/ and summary/)

    def matches(self, phase: Phase, op: str, path: Path) -> bool:
        if (phase, op) != (self.phase, self.op):
            return False
        if any(text in str(path) for text in self.not_in):
            return False
        return str(path).endswith(self.text) if self.suffix else self.text in str(path)


_NOT_A_SHARD_RUN: Final = ("/scans/", "/summary/")
CRASH_POINTS: Final = {
    "prepare": CrashPoint("after", "link", "/recipe.json", suffix=True),  # the recipe, before the plan
    "scan-claim": CrashPoint("after", "link", "/scans/claims/"),
    "scanned": CrashPoint("after", "link", "/scans/done/"),
    "claim": CrashPoint("after", "link", "/claims/", not_in=_NOT_A_SHARD_RUN),
    "write": CrashPoint("before", "write", "output.jsonl"),
    "fsync": CrashPoint("before", "fsync", "output.jsonl"),
    "done": CrashPoint("before", "link", "/done/", not_in=_NOT_A_SHARD_RUN),
    "published": CrashPoint("after", "link", "/done/", not_in=_NOT_A_SHARD_RUN),
    "merge": CrashPoint("before", "merge", ""),
    "finalize": CrashPoint("before", "finalize", ""),
}


@dataclass
class FaultRule:
    """Make matching operations fail: ``op`` (or ``*``), a path substring, an errno name."""

    op: str
    errno: str = ""  # none for mode delay
    path: str | list[str] = ""  # substring(s) the path must contain (all of them)
    mode: Literal["fail", "lie", "delay"] = "fail"
    skip: int = 0  # let this many matching operations pass first
    times: int | None = 1  # then fail (or delay) this many (None: every one)
    delay_secs: float = 0.0  # mode delay: how long each matching operation is held back
    hits: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in ("fail", "lie", "delay"):
            raise ConfigError(f"mode must be 'fail', 'lie' or 'delay', got {self.mode!r}", where=FAULTS_ENV)
        if self.mode == "delay":
            if self.errno or not (isinstance(self.delay_secs, int | float) and self.delay_secs > 0):
                raise ConfigError("mode 'delay' takes delay_secs > 0 and no errno", where=FAULTS_ENV)
        elif self.errno not in FAULT_ERRNOS:
            raise ConfigError(f"unknown errno {self.errno!r}; one of {', '.join(FAULT_ERRNOS)}", where=FAULTS_ENV)

    def fires(self, op: str, path: Path) -> bool:
        wanted = [self.path] if isinstance(self.path, str) else self.path
        if self.op not in ("*", op) or not all(text in str(path) for text in wanted):
            return False
        self.hits += 1
        if self.hits <= self.skip:
            return False
        return self.times is None or self.hits <= self.skip + self.times

    def error(self, op: str, path: Path) -> OSError:
        code = getattr(errno_module, self.errno)
        message = f"{os.strerror(code)} (injected: {self.mode} {op})"
        return OSError(code, message) if op in _UNNAMED_OPS else OSError(code, message, str(path))


class FaultPlan:
    """The rules and the crash point of one process; thread-safe counters."""

    def __init__(self, rules: Sequence[FaultRule] = (), crash: str | None = None):
        self.rules = list(rules)
        self.crash, self.crash_hit = _parse_crash(crash) if crash else (None, 0)
        self._crash_seen = 0
        self._lock = threading.Lock()
        self.injected: list[tuple[str, str, str]] = []  # (op, path, errno) of every injected failure

    def _check(self, phase: Phase, op: str, path: Path) -> None:
        delay = 0.0
        with self._lock:
            if self.crash is not None and self.crash.matches(phase, op, path):
                self._crash_seen += 1
                if self._crash_seen == self.crash_hit:
                    os.kill(os.getpid(), signal.SIGKILL)
            wanted = ("fail", "delay") if phase == "before" else ("lie",)
            for rule in self.rules:
                if rule.mode in wanted and rule.fires(op, path):
                    self.injected.append((op, str(path), rule.errno or f"delay {rule.delay_secs:g}s"))
                    if rule.mode != "delay":
                        raise rule.error(op, path)
                    delay += rule.delay_secs
        if delay:  # outside the lock: other threads' operations go on meanwhile
            logger.warning(f"fault injected: delaying {op} {path} by {delay:g}s")
            time.sleep(delay)

    def before(self, op: str, path: Path) -> None:
        self._check("before", op, path)

    def after(self, op: str, path: Path) -> None:
        self._check("after", op, path)


def _parse_crash(spec: str) -> tuple[CrashPoint, int]:
    name, _, count = spec.partition("@")
    if not count:
        hit = 1
    elif count.isdigit() and int(count) >= 1:
        hit = int(count)
    else:
        raise ConfigError(f"bad crash point {spec!r}: the count after @ must be >= 1", where=CRASH_ENV)
    if name in CRASH_POINTS:
        return CRASH_POINTS[name], hit
    op, sep, text = name.partition(":")
    if sep and op and text:
        return CrashPoint("before", op, text), hit
    raise ConfigError(
        f"unknown crash point {spec!r}", where=CRASH_ENV, hint=f"one of {', '.join(CRASH_POINTS)}, or <op>:<path text>"
    )


def parse_rules(text: str) -> list[FaultRule]:
    try:
        items = json.loads(text)
        if not isinstance(items, list):
            raise TypeError("not a list")
        return [FaultRule(**item) for item in items]
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"bad fault plan: {exc}", where=FAULTS_ENV, hint="a JSON list of rule objects") from None


def hooked_pythonpath(pythonpath: str | None = None) -> str:
    """``pythonpath`` with the plan hook first and this checkout next: a process started with it
    installs the fault plan of its environment at start and runs this checkout's code."""
    first = [str(HOOK_DIR), str(REPO)]
    return os.pathsep.join([*first, *(p for p in (pythonpath or "").split(os.pathsep) if p and p not in first)])


_installed: FaultPlan | None = None


def install(plan: FaultPlan | None) -> None:
    global _installed
    _installed = plan
    if plan is None:
        fault_seam.set_fault_hook(None)
    else:
        fault_seam.set_fault_hook(plan.before, plan.after)


def install_from_env() -> bool:
    """Install the plan the environment names (once per process); False when none is set."""
    crash, rules = os.environ.get(CRASH_ENV, ""), os.environ.get(FAULTS_ENV, "")
    if not (crash or rules):
        return False
    if _installed is None:
        install(FaultPlan(parse_rules(rules) if rules else (), crash or None))
    return True


@contextmanager
def injected(*rules: FaultRule, crash: str | None = None) -> Iterator[FaultPlan]:
    """In-process form for tests: ``with injected(FaultRule("fsync", "ENOSPC")) as plan: ...``."""
    plan = FaultPlan(rules, crash)
    install(plan)
    try:
        yield plan
    finally:
        install(None)
