"""Per-process controller state for the mixin, the attempt context, telemetry files and profiles.

A Ray worker learns its job and attempt from :class:`BatchingContext`, which the ShardRunner writes
into the config's ``work_dir`` (the one per-run argument every operator gets that stage identities
leave out; the warm runtime outlives attempts, so its ``runtime_env`` cannot carry it).  Without one,
micro-batching works the same, without shared profiles or telemetry.

Shared batch profiles: what one process learned, so the next shard on any node starts at a safe size.
One file per (stage identity x accelerator model x cost model x ceiling), ``<job_dir>/batch-profiles/<key>.json``;
advice, never authority (docs/adaptive-batching.md).
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import socket
import sys
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

from loguru import logger

from data_juicer_elastic.batching.engine import BatchStats
from data_juicer_elastic.batching.policy import BatchPolicy
from data_juicer_elastic.compat import dj_ops_internals
from data_juicer_elastic.compat.dj_ops_internals import op_name
from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.layout import JobLayout, ensure_dir
from data_juicer_elastic.jobdir.records import Record
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import safe_name

MAX_AGE_SECS: Final = 24 * 3600.0
_warned: set[str] = set()


@dataclass(frozen=True)
class BatchProfile(Record):
    KIND: ClassVar[str] = "batch-profile"
    stage_key: str
    accelerator: str
    cost_model: str
    max_rows: int
    safe: float | None  # largest micro-batch cost that succeeded
    failing: float | None  # smallest micro-batch cost that ran out of memory (while in force)
    successes: int
    ooms: int
    updated_at: float  # wall clock of the writer (age check only)
    writer: str  # host:pid, informational


def profile_key(stage_key: str, accelerator: str, cost_model: str, max_rows: int) -> str:
    text = "\x1f".join((stage_key, accelerator, cost_model, str(max_rows)))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def read_profile(
    layout: JobLayout, stage_key: str, accelerator: str, cost_model: str, max_rows: int
) -> BatchProfile | None:
    """The usable profile, or None (missing, corrupt, stale or for another configuration)."""
    path = layout.batch_profile(profile_key(stage_key, accelerator, cost_model, max_rows))
    try:
        data = fsio.read_record(path)
    except OSError as exc:
        _warn_once(path, f"cannot read batch profile {path}: {exc}; starting from the configured batch_size")
        return None
    if data is None:
        return None
    try:
        profile = BatchProfile.parse(data, path)
    except JobDirError as exc:
        _warn_once(path, f"ignoring batch profile: {exc}")
        return None
    now = time.time()
    problem = None
    wanted = (stage_key, accelerator, cost_model, max_rows)
    if (profile.stage_key, profile.accelerator, profile.cost_model, profile.max_rows) != wanted:
        problem = "it belongs to another stage or configuration"
    elif abs(now - profile.updated_at) > MAX_AGE_SECS:
        problem = f"it is stale (written {now - profile.updated_at:.0f}s ago)"
    elif not _valid_bounds(profile):
        problem = f"its bounds are not usable (safe={profile.safe}, failing={profile.failing})"
    if problem:
        _warn_once(path, f"ignoring batch profile {path}: {problem}")
        return None
    return profile


def write_profile(layout: JobLayout, profile: BatchProfile) -> Path:
    path = layout.batch_profile(
        profile_key(profile.stage_key, profile.accelerator, profile.cost_model, profile.max_rows)
    )
    ensure_dir(layout, path.parent)
    fsio.atomic_write(path, profile.encode(), durable=False)  # advice: losing it on a crash costs one re-learn
    return path


def _valid_bounds(profile: BatchProfile) -> bool:
    safe, failing = profile.safe, profile.failing
    if any(v is not None and not (0 < v < math.inf) for v in (safe, failing)) or profile.max_rows < 1:
        return False
    if safe is None and failing is None:
        return False
    return safe is None or failing is None or safe < failing


def _warn_once(path: Path, message: str) -> None:
    key = str(path)
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


CONTEXT_FILE: Final = "dj-elastic-batching.json"
PROFILE_MIN_INTERVAL_SECS: Final = 2.0
_MAX_ENTRIES: Final = 64


@dataclass(frozen=True)
class StageRef:
    stage_id: str
    op_fingerprint: str


@dataclass(frozen=True)
class BatchingContext(Record):
    KIND: ClassVar[str] = "batching-context"
    job_dir: str
    shard_id: str
    attempt_id: str
    stages: list[StageRef]
    # The attempt directory when it is not the job's shard attempt ``layout.attempt_dir(shard_id,
    # attempt_id)`` (a dedup phase's attempt); ``job_dir`` is then "" when no job holds it (no profiles).
    attempt_dir: str | None = None

    @property
    def layout(self) -> JobLayout:
        return JobLayout(self.job_dir)

    @property
    def attempt_path(self) -> Path:
        """Where this attempt's files go (the quarantine's worker records, the batch traces)."""
        if self.attempt_dir:
            return Path(self.attempt_dir)
        return self.layout.attempt_dir(self.shard_id, self.attempt_id)


@dataclass(frozen=True)
class BatchTrace(Record):
    KIND: ClassVar[str] = "batch-trace"
    stage_key: str
    accelerator: str
    cost_model: str
    host: str
    pid: int
    updated_at: float
    seeded_from: str | None  # "profile" | "process" (a warm worker's earlier learning) | None
    stats: dict[str, Any]
    policy: dict[str, Any]
    trace: list[list[Any]]  # the last events: [outcome, rows, cost, budget before]


def write_context(work_dir: str | Path, context: BatchingContext) -> Path:
    path = Path(work_dir) / CONTEXT_FILE
    fsio.makedirs(path.parent)
    fsio.atomic_write(path, context.encode(), durable=False)
    return path


_contexts: OrderedDict[str, BatchingContext | None] = OrderedDict()


def read_context(work_dir: str | None) -> BatchingContext | None:
    if not work_dir:
        return None
    path = Path(work_dir) / CONTEXT_FILE
    key = str(path)
    if key not in _contexts:
        context = None
        try:
            context = BatchingContext.read(path)
        except (OSError, JobDirError) as exc:
            logger.warning(f"adaptive batching: ignoring {path}: {exc}; no shared profiles for this attempt")
        _remember(_contexts, key, context)
    return _contexts[key]


class OpState:
    """One operator's policy and this attempt's statistics in this process."""

    def __init__(self, op: Any, mode: str):
        self.work_dir = getattr(op, "work_dir", None)
        self.context = read_context(self.work_dir)
        self.stage_key = stage_key_for(op, self.context)
        self.accelerator = accelerator_model(op)
        self.cost_model = mode
        self.max_rows = int(op.batch_size)
        self.label = f"{self.stage_key} [{self.accelerator}]"
        key = (self.stage_key, self.accelerator, mode, self.max_rows)
        self._published: tuple | None = None  # the bounds the shared profile holds (set by a seed)
        policy = _policies.get(key)
        if policy is None:
            policy = BatchPolicy(self.max_rows, getattr(op, "adaptive_batching_policy", None))
            self.seeded_from = self._seed(policy)
            _remember(_policies, key, policy)
        else:
            _policies.move_to_end(key)
            self.seeded_from = "process" if policy.successes or policy.ooms else None
        self.policy: BatchPolicy = policy
        stats_key = (self.context.attempt_id if self.context else "", *key)
        if stats_key not in _stats:
            _remember(_stats, stats_key, BatchStats())
        self.stats: BatchStats = _stats[stats_key]
        self._published_at = 0.0
        self._published_ooms = 0
        self._warned = False

    def _seed(self, policy: BatchPolicy) -> str | None:
        if self.context is None or not self.context.job_dir:
            return None
        found = read_profile(self.context.layout, self.stage_key, self.accelerator, self.cost_model, self.max_rows)
        if found is None:
            return None
        policy.seed(safe=found.safe, failing=found.failing)
        self._published = (found.safe, found.failing)
        logger.info(f"adaptive batching {self.label}: starting from the shared profile (budget {policy.budget:g})")
        return "profile"

    def after_call(self) -> None:
        if self.context is None:
            return
        try:
            self._write_trace()
            self._maybe_publish()
        except (OSError, JobDirError) as exc:  # telemetry and profiles are advice: never fail the batch
            if not self._warned:
                self._warned = True
                logger.warning(f"adaptive batching {self.label}: cannot write telemetry/profile: {exc}")

    def _write_trace(self) -> None:
        directory = self.context.attempt_path / "batching"
        name = f"{hashlib.sha256(self.stage_key.encode('utf-8')).hexdigest()[:12]}-{host_tag()}-{os.getpid()}.json"
        record = BatchTrace(
            stage_key=self.stage_key,
            accelerator=self.accelerator,
            cost_model=self.cost_model,
            host=socket.gethostname(),
            pid=os.getpid(),
            updated_at=time.time(),
            seeded_from=self.seeded_from,
            stats=self.stats.to_json(),
            policy=self.policy.state(),
            trace=[list(event) for event in self.policy.trace],
        )
        fsio.makedirs(directory)
        fsio.atomic_write(directory / name, record.encode(), durable=False)

    def _maybe_publish(self) -> None:
        state = self.policy.state()
        bounds = (state["safe"], state["failing"])
        if bounds == self._published or bounds == (None, None) or not self.context.job_dir:
            return
        now = time.monotonic()
        if self._published_ooms == self.policy.ooms and now - self._published_at < PROFILE_MIN_INTERVAL_SECS:
            return  # only growth since the last write: coalesce
        write_profile(
            self.context.layout,
            BatchProfile(
                stage_key=self.stage_key,
                accelerator=self.accelerator,
                cost_model=self.cost_model,
                max_rows=self.max_rows,
                safe=state["safe"],
                failing=state["failing"],
                successes=self.policy.successes,
                ooms=self.policy.ooms,
                updated_at=time.time(),
                writer=f"{socket.gethostname()}:{os.getpid()}",
            ),
        )
        self._published, self._published_at, self._published_ooms = bounds, now, self.policy.ooms


_policies: OrderedDict[tuple, BatchPolicy] = OrderedDict()
_stats: OrderedDict[tuple, BatchStats] = OrderedDict()
# Per operator instance, never on the instance: operators are pickled (Ray tasks, datasets' hashing).
_by_op: weakref.WeakKeyDictionary[Any, dict[str, OpState]] = weakref.WeakKeyDictionary()


def state_for(op: Any, mode: str) -> OpState:
    # A warm operator (execution.warm_ops) serves attempt after attempt: its work_dir,
    # where the attempt context lives, changes with each, and so does its state.
    states = _by_op.setdefault(op, {})
    state = states.get(mode)
    if state is None or state.work_dir != getattr(op, "work_dir", None):
        state = states[mode] = OpState(op, mode)
    return state


def summary_for(op: Any) -> dict[str, Any]:
    return {mode: {**s.stats.to_json(), "policy": s.policy.state()} for mode, s in _by_op.get(op, {}).items()}


def reset() -> None:
    """Forget all per-process state (tests; a fresh process starts like this)."""
    _policies.clear()
    _stats.clear()
    _contexts.clear()
    _by_op.clear()


def stage_key_for(op: Any, context: BatchingContext | None) -> str:
    """The operator's stage identity when the context names exactly one, else ``fp-<fingerprint>:<name>``
    (identical operators at several positions then share one profile)."""
    name = op_name(op)
    fingerprint = dj_ops_internals.op_fingerprint(op)  # Data-Juicer's; without it the mixin refused the op
    if context is not None:
        matches = [s.stage_id for s in context.stages if s.op_fingerprint == fingerprint]
        if len(matches) == 1:
            return matches[0]
    return f"fp-{fingerprint[:16]}:{name}"


def accelerator_model(op: Any) -> str:
    """``cpu``, or the CUDA device name and memory (MIG slices of one model differ in memory)."""
    if getattr(op, "accelerator", "cpu") != "cuda":
        return "cpu"
    try:
        torch = sys.modules.get("torch") or importlib.import_module("torch")
        if not torch.cuda.is_available():
            return "cpu"
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{props.name}|{round(props.total_memory / 2**30)}GiB"
    except Exception as exc:  # a broken CUDA setup: the operator itself will report it
        logger.debug(f"adaptive batching: cannot identify the accelerator: {exc}")
        return "cuda-unknown"


# The attempt summary (read by the ShardRunner, shown by dj-elastic status)
_SUMMED: Final = ("ooms", "retries", "floor_waits", "skipped_rows", "terminal_ooms", "slices", "rows_in", "rows_out")


def summarize_attempt(directory: Path) -> dict[str, Any] | None:
    """Fold the size traces under ``attempts/<shard>/<attempt>/batching`` into one JSON summary."""
    stages: dict[str, dict[str, Any]] = {}
    for name in sorted(fsio.list_names(directory)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = directory / name
        try:
            trace = BatchTrace.read(path)
        except (OSError, JobDirError) as exc:
            logger.warning(f"ignoring batching trace: {exc}")
            continue
        if trace is None:
            continue
        stage = stages.setdefault(
            trace.stage_key,
            {"accelerator": trace.accelerator, "cost_model": trace.cost_model, "processes": 0, "seeded_from": []}
            | {k: 0 for k in _SUMMED}
            | {"oom_kinds": {}, "first_rows": None, "final_rows": None, "min_rows": None, "max_rows": None},
        )
        stage["processes"] += 1
        if trace.seeded_from and trace.seeded_from not in stage["seeded_from"]:
            stage["seeded_from"].append(trace.seeded_from)
        for key in _SUMMED:
            stage[key] += int(trace.stats.get(key) or 0)
        for kind, n in (trace.stats.get("oom_kinds") or {}).items():
            stage["oom_kinds"][kind] = stage["oom_kinds"].get(kind, 0) + int(n)
        for key, pick in (("min_rows", min), ("max_rows", max), ("first_rows", max)):
            value = trace.stats.get(key)
            if value is not None:
                stage[key] = value if stage[key] is None else pick(stage[key], value)
        if trace.stats.get("final_rows") is not None and trace.updated_at >= stage.get("_updated", 0.0):
            stage["final_rows"], stage["_updated"] = trace.stats["final_rows"], trace.updated_at
            stage["last_trace"] = trace.trace[-8:]
    if not stages:
        return None
    for stage in stages.values():
        stage.pop("_updated", None)
    totals = {key: sum(s[key] for s in stages.values()) for key in ("ooms", "retries", "terminal_ooms", "skipped_rows")}
    return {**totals, "stages": stages}


def _remember(cache: OrderedDict, key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _MAX_ENTRIES:
        cache.popitem(last=False)


def host_tag() -> str:
    """This host's name as a part of a file name (the telemetry and quarantine record files)."""
    return safe_name(socket.gethostname())[:40]
