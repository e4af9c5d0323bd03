"""Where an elastic demo run's wall time went, read back from what the run left behind.

Two sources, both written by the run itself (nothing is instrumented for the benchmark):

- the instance's node log (``<job_dir>/logs/<node>/<instance>.log``, loguru lines with local
  timestamps): run start, prepare, Ray start, each shard, the worker's end, finalize;
- the Ray session of the run (``/tmp/ray/session_*_<driver pid>/logs``): when the raylet
  started each worker process, when that process had Python and Ray's core worker up
  (the first line of ``python-core-worker-*_<pid>.log``), and what it ran (the
  ``:task_name:`` / ``:actor_name:`` lines Ray writes to ``worker-*-<pid>.out``).

Times are seconds since the benchmark started the process.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

_LOGURU = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) \| \w+\s*\| (\S+) - (.*)$")
_RAY = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_STARTED = re.compile(r"Started worker process with pid (\d+)")

# (phase, pattern in the node log); the first match of each is its time.
_MARKS = (
    ("run_start", "of run "),
    ("prepared", "data_juicer_elastic.preparation:"),
    ("worker_joined", "joining job"),
    ("ray_ready", "Ray runtime ready at"),
    ("warm_ready", "Ray workers warm"),
    ("first_claim", "claimed part-"),
    ("worker_finished", "worker .* finished:"),
    ("finalized", "finalized by"),
)


def _epoch(stamp: str, fmt: str) -> float:
    return dt.datetime.strptime(stamp, fmt).timestamp()  # naive local time, as both logs write it


def node_log_marks(log: Path) -> dict[str, Any]:
    """Epoch times of the phase marks and of every shard's end (``rows out in``)."""
    marks: dict[str, float] = {}
    shard_ends: list[float] = []
    shard_secs: list[float] = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        match = _LOGURU.match(line)
        if match is None:
            continue
        when = _epoch(match[1], "%Y-%m-%d %H:%M:%S.%f")
        text = f"{match[2]} - {match[3]}"
        for name, pattern in _MARKS:
            if name not in marks and re.search(pattern, text):
                marks[name] = when
        found = re.search(r"rows out in ([\d.]+)s", text)
        if found:
            shard_ends.append(when)
            shard_secs.append(float(found[1]))
    return {"marks": marks, "shard_ends": shard_ends, "shard_secs": shard_secs}


def phases(started: float, ended: float, log: Path) -> dict[str, float]:
    """Seconds per phase: imports+config (process start -> run start), prepare, Ray start,
    warm-up (Ray ready -> workers warm, when the run warms them), first shard (-> its end),
    later shards, Ray shutdown (last shard -> worker finished) and finalize (-> process exit).
    Prepare and Ray start overlap when ``ray_beside_prepare`` is 1."""
    read = node_log_marks(log)
    m, ends = read["marks"], read["shard_ends"]
    out = {"wall": ended - started}
    if "run_start" not in m or not ends:
        return out
    out["imports_config"] = m["run_start"] - started
    out["prepare"] = m.get("prepared", m["run_start"]) - m["run_start"]
    if "ray_ready" in m:
        # Ray starts after the worker joined, or (when started early) beside prepare, from the run's start
        overlapped = m["ray_ready"] < m.get("worker_joined", m["ray_ready"])
        out["ray_start"] = m["ray_ready"] - (m["run_start"] if overlapped else m.get("worker_joined", m["run_start"]))
        out["ray_beside_prepare"] = float(overlapped)
        out["first_shard"] = ends[0] - m.get("warm_ready", m["ray_ready"])
    if "warm_ready" in m and "ray_ready" in m:
        out["warm_up"] = m["warm_ready"] - m["ray_ready"]  # Ray ready -> its first task worker warm
    out["later_shards"] = ends[-1] - ends[0]
    out["later_shard_each"] = out["later_shards"] / max(1, len(ends) - 1)
    if "worker_finished" in m:
        out["ray_shutdown"] = m["worker_finished"] - ends[-1]
        out["finalize_exit"] = ended - m["worker_finished"]
    return out


def ray_workers(session_logs: Path, started: float) -> list[dict[str, Any]]:
    """Each Ray worker process of the run: when started, when Python + Ray's core worker was up, its roles."""
    workers: dict[int, dict[str, Any]] = {}
    raylet = session_logs / "raylet.out"
    if raylet.exists():
        for line in raylet.read_text(errors="replace").splitlines():
            stamp, pid = _RAY.match(line), _STARTED.search(line)
            if stamp and pid:
                workers[int(pid[1])] = {
                    "pid": int(pid[1]),
                    "spawned": _epoch(stamp[1], "%Y-%m-%d %H:%M:%S,%f") - started,
                }
    for pid, info in workers.items():
        for core in session_logs.glob(f"python-core-worker-*_{pid}.log"):
            first = core.read_text(errors="replace").splitlines()[:1]
            stamp = _RAY.match(first[0]) if first else None
            if stamp:
                info["core_worker_up"] = _epoch(stamp[1], "%Y-%m-%d %H:%M:%S,%f") - started
        roles: list[str] = []
        for out in session_logs.glob(f"worker-*-{pid}.out"):
            for line in out.read_text(errors="replace").splitlines():
                if line.startswith((":task_name:", ":actor_name:")) and line not in roles:
                    roles.append(line)
        info["roles"] = [r.split(":", 2)[2][:60] for r in roles]
    return sorted(workers.values(), key=lambda w: w["spawned"])


def session_of(pid: int, root: Path = Path("/tmp/ray")) -> Path | None:
    """The Ray session a ``local`` driver with this pid started (Ray names it after the pid)."""
    found = sorted(root.glob(f"session_*_{pid}"))
    return found[-1] / "logs" if found else None
