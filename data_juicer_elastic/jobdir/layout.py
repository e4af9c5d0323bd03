"""Every path of a job directory, in one place, and every write kept inside it.

Nothing else in the package joins path fragments of a job directory, so the layout documented in
``docs/architecture.md`` is this file.  Identifiers that come from outside (a CLI argument, a
directory listing, a record) are checked against strict patterns before they become path components,
so ``../x`` or an absolute path can never escape the job directory; a symlink planted in it is refused
before anything is written below it, and a directory that is not ours is refused
(docs/job-dir-security.md).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

from data_juicer_elastic.errors import ConfigError, JobDirError, UnsafePathError, preview
from data_juicer_elastic.rows.codecs import SHARD_SUFFIX
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import safe_name

MAX_SHARDS: Final = 99_999  # five digits in the shard id
_SHARD_ID: Final = re.compile(r"^part-(\d{5})-of-(\d{5})$")
# Attempt ids come from WorkerIdentity.new_attempt_id(): the pattern only excludes separators and dot-names.
_ATTEMPT_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,159}$")
LOG_FILE: Final = "process.log"  # an attempt's log (execution.shard_runner writes it, status names it)
_GEN_FILE: Final = re.compile(r"^gen-(\d{6,})\.json$")
# Batch profile keys are hashes (batching.runtime.profile_key), never user text.
_PROFILE_KEY: Final = re.compile(r"^[0-9a-f]{32}$")
# A run key is a hash of the run id (coordination.run.run_key): fixed-size hex, never user text.
_RUN_KEY: Final = re.compile(r"^[0-9a-f]{16,64}$")
PHASES: Final = ("prepare", "finalize")


def shard_id(index: int, count: int) -> str:
    """``part-00003-of-00016`` for the zero-based ``index`` of ``count`` shards."""
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigError(f"num_shards must be between 1 and {MAX_SHARDS}, got {count}", where="num_shards")
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} out of range for {count} shards")
    return f"part-{index:05d}-of-{count:05d}"


def shard_ids(count: int) -> list[str]:
    """Every shard id of a job of ``count`` shards, in index order."""
    template = shard_id(0, count).replace("part-00000", "part-%05d", 1)  # the range check, then one format each
    return [template % index for index in range(count)]


def parse_shard_id(value: str) -> tuple[int, int]:
    """(index, count) of a well-formed shard id; JobDirError otherwise."""
    match = _SHARD_ID.match(value) if isinstance(value, str) else None
    if match is None:
        raise JobDirError(
            f"invalid shard id {value!r}", where="shard id", hint="shard ids look like part-00003-of-00016"
        )
    index, count = int(match.group(1)), int(match.group(2))
    if not (1 <= count and index < count):
        raise JobDirError(f"invalid shard id {value!r}: index out of range", where="shard id")
    return index, count


def is_shard_id(value: str) -> bool:
    """Whether ``value`` is a well-formed shard id (:func:`parse_shard_id` without the exception:
    a listing of 100,000 names is checked in a few milliseconds)."""
    match = _SHARD_ID.match(value)
    return match is not None and int(match[1]) < int(match[2])


def validate_shard_id(value: str) -> str:
    parse_shard_id(value)
    return value


def validate_attempt_id(value: str) -> str:
    if not isinstance(value, str) or not _ATTEMPT_ID.match(value) or ".." in value:
        raise JobDirError(f"invalid attempt id {value!r}", where="attempt id")
    return value


def validate_run_key(value: str) -> str:
    if not isinstance(value, str) or not _RUN_KEY.match(value):
        raise JobDirError(f"invalid run key {value!r}", where="coordination", hint="run keys are 16-64 hex digits")
    return value


def validate_phase(value: str) -> str:
    if value not in PHASES:
        raise ValueError(f"unknown coordination phase {value!r}; expected one of {PHASES}")
    return value


def gen_name(generation: int) -> str:
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
        raise ValueError(f"generation must be an integer >= 1, got {generation!r}")
    return f"gen-{generation:06d}.json"


def parse_gen_name(name: str) -> int | None:
    """The generation of a ``gen-NNNNNN.json`` name, None for anything else (temp files, .nfs leftovers)."""
    match = _GEN_FILE.match(name)
    return int(match.group(1)) if match else None


SCANS: Final = "scans"  # the scan tasks' namespace (JobLayout.scans)
SUMMARY: Final = "summary"  # the job summary's namespace (JobLayout.summary_lease): its writer's lease
# A run's prepare and finalize roles (JobLayout.role_lease): coordination/<run-key>/<phase>/
_ROLE_NAMESPACE: Final = re.compile(r"^coordination/[0-9a-f]{16,64}/(prepare|finalize)$")
# The deduplication phases of stage k (JobLayout.dedup_tasks): dedup/<k>/<phase>/ (dedup.phases)
DEDUP: Final = "dedup"
DEDUP_PHASES: Final = ("signatures", "buckets", "cluster")
_DEDUP_NAMESPACE: Final = re.compile(r"^dedup/[1-9][0-9]{0,5}/(signatures|buckets|cluster)$")
# The one task of a role's namespace (the summary writer, a run's prepare or finalize: jobdir.roles),
# with a shard's lease records.
ROLE_TASK: Final = "part-00000-of-00001"


def resolve_user_path(path: str | os.PathLike) -> Path:
    """A path as the user gave it (``~``, relative to the working directory), made absolute the
    one way prepare records it (the job directory, the dataset's paths), and every later instance
    compares it."""
    return Path(path).expanduser().resolve()


def _under(base: str, name: str) -> property:
    """A path property: ``name`` under the layout's ``base`` attribute (``root`` or ``tasks_root``)."""
    return property(lambda self: getattr(self, base) / name)


class JobLayout:
    """Paths of one job directory (pure: touches no filesystem).  A shard's *run* (``claims/``,
    ``done/`` ... at the top) and its *scan* (:attr:`scans`: the same names under ``scans/``) go
    through the same lease protocol: every per-task path comes from :attr:`tasks_root`."""

    def __init__(self, root: str | Path, tasks: str | None = None):
        self.root = Path(root)
        if tasks not in (None, SCANS, SUMMARY) and not (_ROLE_NAMESPACE.match(tasks) or _DEDUP_NAMESPACE.match(tasks)):
            raise ValueError(f"unknown task namespace {tasks!r}")
        self.tasks = tasks
        self.tasks_root = self.root / tasks if tasks else self.root

    def __repr__(self) -> str:
        return f"JobLayout({str(self.root)!r}{f', tasks={self.tasks!r}' if self.tasks else ''})"

    @property
    def scans(self) -> JobLayout:
        """The scan tasks' layout (claims, heartbeats, attempts, done markers of scans)."""
        return JobLayout(self.root, SCANS)

    @property
    def summary_lease(self) -> JobLayout:
        """The summary writer's lease (task :data:`ROLE_TASK` under ``summary/``)."""
        return JobLayout(self.root, SUMMARY)

    def role_lease(self, run_key: str, phase: str) -> JobLayout:
        """A run's prepare or finalize role (task :data:`ROLE_TASK` under ``coordination/<run-key>/<phase>/``)."""
        return JobLayout(self.root, f"coordination/{validate_run_key(run_key)}/{validate_phase(phase)}")

    # -- deduplication across shards (dedup.phases; docs/dedup.md) --------------
    dedup_dir = _under("root", DEDUP)

    def dedup_stage(self, stage: int) -> Path:
        if isinstance(stage, bool) or not isinstance(stage, int) or not 1 <= stage <= 999_999:
            raise ValueError(f"invalid deduplication stage {stage!r}")
        return self.dedup_dir / str(stage)

    def dedup_tasks(self, stage: int, phase: str) -> JobLayout:
        """The tasks of one phase of stage ``stage`` (``dedup/<k>/<phase>/``: claims, attempts ...)."""
        if phase not in DEDUP_PHASES:
            raise ValueError(f"unknown deduplication phase {phase!r}; expected one of {DEDUP_PHASES}")
        return JobLayout(self.root, f"{DEDUP}/{self.dedup_stage(stage).name}/{phase}")

    def dedup_signatures(self, stage: int, shard_id: str) -> Path:
        return self.dedup_stage(stage) / "signatures" / f"{validate_shard_id(shard_id)}.sig"

    def dedup_bucket_plan(self, stage: int) -> Path:
        return self.dedup_stage(stage) / "buckets" / "plan.json"

    def dedup_edges(self, stage: int, task_id: str) -> Path:
        return self.dedup_stage(stage) / "edges" / f"{validate_shard_id(task_id)}.edges"

    def dedup_drops(self, stage: int, shard_id: str) -> Path:
        return self.dedup_stage(stage) / "drops" / f"{validate_shard_id(shard_id)}.drops"

    def dedup_cluster(self, stage: int) -> Path:
        return self.dedup_stage(stage) / "cluster.json"

    # -- the job summary (jobdir.job_summary) --------------------------------
    summary_dir = _under("root", SUMMARY)
    summary = _under("summary_dir", "summary.json")
    summary_seq = _under("summary_dir", "summary.seq")
    summary_brief = _under("summary_dir", "brief.json.z")  # what workers read (jobdir.job_summary)
    paces_dir = _under("summary_dir", "paces")

    def pace(self, worker_key: str) -> Path:
        return self.paces_dir / f"{validate_attempt_id(worker_key)}.json"

    # -- top level -----------------------------------------------------------------
    manifest = _under("root", "manifest.json")
    manifest_rows = _under("root", "manifest-rows.json")  # jobdir.manifest
    plan = _under("root", "plan.json")
    recipe = _under("root", "recipe.json")
    merge_record = _under("root", "merge.json")
    clean_record = _under("root", "clean.json")  # the shard outputs were removed (jobdir.exports)
    cache_dir = _under("root", "cache")
    shards_dir = _under("root", "shards")
    stats_dir = _under("root", "stats")  # overall statistics written by finalize: overall.json, overall.csv
    coordination_dir = _under("root", "coordination")
    logs_dir = _under("root", "logs")
    batch_profiles_dir = _under("root", "batch-profiles")
    code_changes_dir = _under("root", "code-changes")  # operator code accepted by retry (jobdir.retry)
    claims_dir = _under("tasks_root", "claims")
    heartbeats_dir = _under("tasks_root", "heartbeats")
    releases_dir = _under("tasks_root", "releases")
    failures_dir = _under("tasks_root", "failures")
    attempts_dir = _under("tasks_root", "attempts")
    done_dir = _under("tasks_root", "done")
    failed_dir = _under("tasks_root", "failed")
    history_dir = _under("tasks_root", "history")

    def batch_profile(self, key: str) -> Path:
        if not isinstance(key, str) or not _PROFILE_KEY.match(key):
            raise JobDirError(f"invalid batch profile key {key!r}", where="batch-profiles")
        return self.batch_profiles_dir / f"{key}.json"

    # -- per shard -----------------------------------------------------------------
    def shard(self, shard_id: str, suffix: str = ".jsonl") -> Path:
        """The input shard file; ``suffix`` comes from the manifest's shard codec (codecs.SHARD_SUFFIX)."""
        if suffix not in SHARD_SUFFIX.values():
            raise JobDirError(f"invalid shard suffix {suffix!r}", where="shard codec")
        return self.shards_dir / f"{validate_shard_id(shard_id)}{suffix}"

    def claim_dir(self, shard_id: str) -> Path:
        return self.claims_dir / validate_shard_id(shard_id)

    def claim(self, shard_id: str, generation: int) -> Path:
        return self.claim_dir(shard_id) / gen_name(generation)

    def heartbeat(self, shard_id: str, generation: int) -> Path:
        return self.heartbeats_dir / validate_shard_id(shard_id) / gen_name(generation)

    def release_dir(self, shard_id: str) -> Path:
        return self.releases_dir / validate_shard_id(shard_id)

    def release(self, shard_id: str, generation: int) -> Path:
        return self.release_dir(shard_id) / gen_name(generation)

    def failure_dir(self, shard_id: str) -> Path:
        return self.failures_dir / validate_shard_id(shard_id)

    def failure(self, shard_id: str, generation: int) -> Path:
        return self.failure_dir(shard_id) / gen_name(generation)

    def attempt_root(self, shard_id: str) -> Path:
        return self.attempts_dir / validate_shard_id(shard_id)

    def attempt_dir(self, shard_id: str, attempt_id: str) -> Path:
        return self.attempt_root(shard_id) / validate_attempt_id(attempt_id)

    def attempt_record(self, shard_id: str, attempt_id: str) -> Path:
        return self.attempt_dir(shard_id, attempt_id) / "attempt.json"

    def attempt_copy(self, shard_id: str, attempt_id: str, suffix: str = ".jsonl") -> Path:
        """A scan attempt's copy of its shard (``copy_shards``), linked to :meth:`shard` once the
        manifest is composed (``jobdir.manifest``)."""
        if suffix not in SHARD_SUFFIX.values():
            raise JobDirError(f"invalid shard suffix {suffix!r}", where="shard codec")
        return self.attempt_dir(shard_id, attempt_id) / f"shard{suffix}"

    def attempt_batching_dir(self, shard_id: str, attempt_id: str) -> Path:
        return self.attempt_dir(shard_id, attempt_id) / "batching"

    def attempt_batching_summary(self, shard_id: str, attempt_id: str) -> Path:
        return self.attempt_dir(shard_id, attempt_id) / "batching.json"

    def attempt_progress(self, shard_id: str, attempt_id: str) -> Path:
        return self.attempt_dir(shard_id, attempt_id) / "progress.json"

    def done(self, shard_id: str) -> Path:
        return self.done_dir / f"{validate_shard_id(shard_id)}.json"

    def failed(self, shard_id: str) -> Path:
        return self.failed_dir / f"{validate_shard_id(shard_id)}.json"

    def history(self, shard_id: str) -> Path:
        return self.history_dir / validate_shard_id(shard_id)

    # -- coordination of one run (one submission of the job) ------------------------------
    # Inside the job directory, so the roles are on its filesystem (docs/architecture.md, "Job directory").
    def run_dir(self, run_key: str) -> Path:
        return self.coordination_dir / validate_run_key(run_key)

    def run_record(self, run_key: str) -> Path:
        return self.run_dir(run_key) / "run.json"

    def prepare_result(self, run_key: str) -> Path:
        return self.run_dir(run_key) / "prepare.result.json"

    def outcome(self, run_key: str) -> Path:
        return self.run_dir(run_key) / "outcome.json"

    def participants_dir(self, run_key: str) -> Path:
        return self.run_dir(run_key) / "participants"

    def participant(self, run_key: str, instance_id: str) -> Path:
        return self.participants_dir(run_key) / f"{validate_attempt_id(instance_id)}.json"

    # -- per-node logs ---------------------------------------------------------------------
    def node_log_dir(self, node_id: str) -> Path:
        return self.logs_dir / safe_name(node_id)

    def node_log(self, node_id: str, name: str) -> Path:
        return self.node_log_dir(node_id) / f"{validate_attempt_id(name)}.log"

    # -- relative paths stored in records -------------------------------------------
    def relative(self, path: Path) -> str:
        """``path`` relative to the job root as a POSIX string (for records: the job dir may move)."""
        return Path(path).relative_to(self.root).as_posix()

    def resolve_relative(self, rel: str) -> Path:
        """Inverse of :meth:`relative`, refusing anything that leaves the job directory."""
        parts = Path(rel).parts if isinstance(rel, str) else ()
        if not parts or Path(rel).is_absolute() or any(p in ("..", ".", "") for p in parts):
            raise JobDirError(f"path {rel!r} in a record is not inside the job directory", where=str(self.root))
        return self.root.joinpath(*parts)


# Every name the plugin itself puts at the top of a job directory (docs/architecture.md).
OUR_NAMES: Final = frozenset(
    "manifest.json manifest-rows.json plan.json scans recipe.json merge.json clean.json shards claims heartbeats "
    "releases failures attempts done failed history cache coordination logs batch-profiles stats summary "
    "code-changes dedup".split()
)
# Hidden names are ours too: staging directories, temp files beside records, NFS
# ``.nfsXXXX`` leftovers.  Lost+found appears at the top of a fresh filesystem.
_IGNORED_PREFIXES: Final = (".",)
_IGNORED_NAMES: Final = frozenset({"lost+found"})


def check_inside(layout: JobLayout, path: str | Path) -> Path:
    """``path`` if it (lexically and after resolving links) lies in the job directory, else
    UnsafePathError naming the link that leads out.  Names that do not exist yet resolve
    lexically; links are resolved only when there are some."""
    path = Path(path)
    root = layout.root
    text, prefix = str(path), str(root).rstrip(os.sep) + os.sep
    if text != str(root) and not text.startswith(prefix):
        raise UnsafePathError(f"{path} is not inside the job directory", where=str(root))
    current = prefix[:-1]
    for part in text[len(prefix) :].split(os.sep) if text != str(root) else ():
        if part in ("..", "."):
            raise UnsafePathError(f"{path} is not inside the job directory", where=str(root))
        current = os.path.join(current, part)
        if os.path.islink(current):
            _check_link(root, path, Path(current))
    return path


def _check_link(root: Path, path: Path, link: Path) -> None:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise UnsafePathError(
            f"{path} leads outside the job directory (it resolves to {real}): a symlink was planted in it",
            where=str(link),
            hint="remove the link (dj-elastic never writes through links out of a job directory) or use a new job_dir",
        )


def ensure_dir(layout: JobLayout, directory: str | Path) -> Path:
    """``makedirs`` of a job-directory path, refused before anything is created outside."""
    directory = check_inside(layout, directory)
    fsio.makedirs(directory)
    return directory


def check_layout(layout: JobLayout) -> None:
    """Refuse a job directory whose top-level entries are links leading outside it (cheap:
    one ``lstat`` per name; per-shard directories are checked when written)."""
    for name in sorted(OUR_NAMES):
        path = layout.root / name
        if os.path.islink(path):
            check_inside(layout, path)


def check_ours(layout: JobLayout) -> None:
    """Refuse a job directory that holds anything but a dj-elastic job (or nothing), before the first
    write into one without a manifest: a ``job_dir`` pointed at a home directory must not litter it."""
    foreign = [
        name
        for name in fsio.list_names(layout.root)
        if name not in OUR_NAMES and name not in _IGNORED_NAMES and not name.startswith(_IGNORED_PREFIXES)
    ]
    if foreign:
        raise JobDirError(
            f"job_dir is not empty and is not a dj-elastic job directory (it holds {preview(foreign)})",
            where=str(layout.root),
            hint="point elastic.job_dir at a new or empty directory",
        )
    check_layout(layout)


def make_job_dir(layout: JobLayout) -> None:
    """Create the job directory if needed; JobDirError (not a traceback) when a file is in the way."""
    root = layout.root
    if os.path.lexists(root) and not os.path.isdir(root):
        raise not_a_directory(root)
    try:
        fsio.makedirs(root)
    except (FileExistsError, NotADirectoryError):
        raise not_a_directory(root) from None


def not_a_directory(root: Path) -> JobDirError:
    return JobDirError(
        "job_dir is not a directory (a file is at that path or above it)",
        where=str(root),
        hint="point job_dir at a new or empty directory, or at a prepared job directory",
    )


def open_job_dir(layout: JobLayout) -> None:
    """Create the job directory if needed and refuse it unless it is (or can become) ours:
    empty, or a dj-elastic job whose top-level directories do not lead elsewhere."""
    make_job_dir(layout)
    if fsio.exists(layout.manifest) or fsio.exists(layout.plan):
        check_layout(layout)  # the manifest itself is validated by whoever loads it
    else:
        check_ours(layout)
