"""Checks behind ``dj-elastic doctor``: is the plugin wired into this Data-Juicer, and
does a (shared) directory support what the job directory relies on."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import re
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.specifiers import SpecifierSet

from data_juicer_elastic import DATA_JUICER_REQUIREMENT
from data_juicer_elastic.compat import (
    ddsketch_store,
    dj_config_internals,
    dj_ops_internals,
    importlib_deferred,
    loguru_internals,
    ray_internals,
)
from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.integration import patch_records, patches
from data_juicer_elastic.integration.mount_cache import advise, mount_of
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.settings import DEFAULT_LEASE_TTL_SECS

ENTRY_POINT_GROUP = "data_juicer.ops"
ENTRY_POINT_MODULE = "data_juicer_elastic.integration.entrypoint"


def _version_bound(operator: str) -> tuple[int, ...]:
    """A bound of :data:`DATA_JUICER_REQUIREMENT` (``>=`` or ``<``) as numbers."""
    (bound,) = re.findall(rf"{operator}(\d+(?:\.\d+)*)", DATA_JUICER_REQUIREMENT.split("py-data-juicer", 1)[1])
    return tuple(int(part) for part in bound.split("."))


MIN_DJ = _version_bound(">=")
MAX_DJ_EXCLUSIVE = _version_bound("<")

# Every self-check of compat/, in the order doctor lists them: (name, a check that returns a one-line
# "found ..." or raises the error naming the internal that moved).
COMPAT_CHECKS = [
    ("ray_concat", ray_internals.check_ray_concat),
    ("ray_map_batches", ray_internals.check_ray_map_batches),
    ("ray_streaming_executor", ray_internals.check_ray_streaming_executor),
    ("ray_services", ray_internals.check_ray_services),
    ("ray_global_node", ray_internals.check_ray_global_node),
    ("ray_sigterm_handler", ray_internals.check_ray_sigterm_handler),
    ("dj_ray_dataset", dj_ops_internals.check_dj_ray_dataset),
    ("dj_load_ops", dj_config_internals.check_dj_load_ops),
    ("dj_op_attributes", dj_ops_internals.check_dj_op_attributes),
    ("dj_op_metaclass", dj_ops_internals.check_dj_op_metaclass),
    ("dj_op_error_hooks", dj_ops_internals.check_dj_op_error_hooks),
    ("dj_free_models", dj_ops_internals.check_dj_free_models),
    ("dj_file_listing", dj_ops_internals.check_dj_file_listing),
    ("dj_resource_utils", dj_ops_internals.check_dj_resource_utils),
    ("dj_stage_identities", dj_ops_internals.check_dj_stage_identities),
    ("dj_op_fusion", dj_ops_internals.check_dj_op_fusion),
    ("dj_ray_executor", dj_ops_internals.check_dj_ray_executor),
    ("dj_config_module", dj_config_internals.check_dj_config_module),
    ("dj_tool_main", dj_config_internals.check_dj_tool_main),
    ("dj_executor_factory", dj_ops_internals.check_dj_executor_factory),
    ("jsonargparse_actions", dj_config_internals.check_jsonargparse_actions),
    ("ddsketch_store", ddsketch_store.check_ddsketch_store),
    ("importlib_deferred", importlib_deferred.check_importlib_deferred),
    ("loguru_handlers", loguru_internals.check_loguru_handlers),
    ("loguru_file_sinks", loguru_internals.check_loguru_file_sinks),
    ("ray_worker_mode", ray_internals.check_ray_worker_mode),
]

# What the deduplicators import (setup.cfg's install_requires pins the same): distribution -> (module,
# requirement, what needs it).  Missing, Data-Juicer's lazy loader pip-installs it on every node at run time.
DEDUP_DEPENDENCIES = {
    "scipy": ("scipy", ">=1.11,<2", "document_minhash_deduplicator (its band choice, optimal_param)"),
    "simhash-pybind": ("simhash", "==0.0.3", "document_simhash_deduplicator (its hashes)"),
}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""
    warn: bool = False  # shown as [warn]: worth acting on, but nothing is lost (exit code unaffected)


def integration_checks() -> list[Check]:
    """Entry point installed and loaded, each patch applied, Data-Juicer version supported (after
    importing Data-Juicer's config, tools and executor factory, so every deferred patch has run)."""
    checks = [_entry_point_check(), _version_check()]
    for module in (
        patch_records.CONFIG_MODULE,
        patch_records.PROCESS_MODULE,
        patch_records.ANALYZE_MODULE,
        patch_records.FACTORY_MODULE,
    ):
        try:
            __import__(module)
        except Exception as exc:  # report, do not crash doctor
            checks.append(Check(f"import {module}", False, repr(exc)))
    if patches.installed():
        checks.append(Check("entry point loaded", True, "patches installed by data_juicer.ops plugin discovery"))
    else:
        checks.append(Check("entry point loaded", False, "data_juicer.ops did not load the plugin (see its warnings)"))
    return [*checks, *_patch_checks(), _parser_check(), *compat_checks(), *dependency_checks()]


def verdict(checks: list[Check], job_dir: str | None) -> str:
    """The one line doctor leads with: can elastic_sharded run here (and on ``job_dir``)?  The checks
    themselves are ~40 lines about internals, listed after it only with ``-v`` or when one failed."""
    failed = [check.name for check in checks if not (check.ok or check.warn)]
    warned = sum(check.warn for check in checks)
    if failed:
        shown = ", ".join(failed[:3]) + (", ..." if len(failed) > 3 else "")
        return f"FAIL: {len(failed)} of {len(checks)} checks failed ({shown}); each check follows"
    where = f" and {job_dir} can hold a job directory" if job_dir else ""
    caveat = f", {warned} with a warning below" if warned else ""
    return (
        f"OK: executor_type elastic_sharded works with Data-Juicer {patch_records.dj_version()}{where} "
        f"({len(checks)} checks passed{caveat}; -v lists them)"
    )


def report_lines(checks: list[Check], job_dir: str | None, verbose: bool) -> list[str]:
    """The verdict, then every check after a failure or with ``-v``; a warning always (worth acting on)."""
    failed = not all(check.ok or check.warn for check in checks)
    return [verdict(checks, job_dir)] + [
        f"[{'warn' if check.warn else 'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}"
        for check in checks
        if failed or check.warn or verbose
    ]


def compat_checks() -> list[Check]:
    """Each check of :data:`COMPAT_CHECKS`: does the internal it names still exist?"""
    checks = []
    for name, check in COMPAT_CHECKS:
        try:
            checks.append(Check(f"compat {name}", True, check()))
        except Exception as exc:  # reported, never raised: every check must run
            checks.append(Check(f"compat {name}", False, repr(exc)))
    return checks


def dependency_checks() -> list[Check]:
    """Each of :data:`DEDUP_DEPENDENCIES` installed at its pinned version: a warning otherwise (a recipe
    without that deduplicator runs as before; one with it is refused at submission, or Data-Juicer
    would install the package mid-run)."""
    checks = []
    for distribution, (module, requirement, needed_by) in DEDUP_DEPENDENCIES.items():
        name, fix = f"dependency {distribution}", f"pip install '{distribution}{requirement}' (pip install -e . does)"
        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            version = None
        if version is None or importlib.util.find_spec(module) is None:
            detail = f"not installed; {needed_by} needs it: {fix}"
            checks.append(Check(name, False, detail, warn=True))
        elif version not in SpecifierSet(requirement):
            detail = f"{version} installed, {requirement} required by {needed_by}: {fix}"
            checks.append(Check(name, False, detail, warn=True))
        else:
            checks.append(Check(name, True, f"{version} ({requirement}; {needed_by})"))
    return checks


def _entry_point_check() -> Check:
    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.value == ENTRY_POINT_MODULE]
    if found:
        return Check("entry point installed", True, f"{ENTRY_POINT_GROUP}: {found[0].name} = {found[0].value}")
    detail = f"no {ENTRY_POINT_GROUP} entry point for {ENTRY_POINT_MODULE}; reinstall data-juicer-elastic"
    return Check("entry point installed", False, detail)


def _version_check() -> Check:
    version, supported = patch_records.dj_version(), DATA_JUICER_REQUIREMENT
    if version is None:
        return Check("Data-Juicer version", False, f"py-data-juicer is not installed (need {supported})")
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    numbers = tuple(int(part or 0) for part in match.groups()) if match else (0, 0, 0)
    ok = MIN_DJ <= numbers < MAX_DJ_EXCLUSIVE
    return Check("Data-Juicer version", ok, f"{version} ({'supported' if ok else 'unsupported'}: {supported})")


def _patch_checks() -> list[Check]:
    checks = []
    for record in patch_records.RECORDS.values():
        ok = record.state == "applied"
        detail = record.state + (f": {record.detail}" if record.detail else "")
        optional = " (optional)" if not record.required and not ok else ""
        checks.append(Check(f"patch {record.target}", ok or not record.required, detail + optional))
    return checks


def _parser_check() -> Check:
    try:
        parser = dj_config_internals.base_parser()
    except Exception as exc:
        return Check("parser accepts elastic_sharded", False, repr(exc))

    action = dj_config_internals.action_for(parser, "executor_type")
    choices = list(getattr(action, "choices", None) or [])
    options = dj_config_internals.dests_starting(parser, "elastic.")
    ok = "elastic_sharded" in choices and bool(options)
    detail = f"executor_type choices {choices}; {len(options)} elastic.* options"
    return Check("parser accepts elastic_sharded", ok, detail)


def filesystem_checks(path: str | os.PathLike) -> list[Check]:
    """Exclusive create (O_EXCL), hard link and rename inside ``path``; temp files are removed."""
    directory = Path(path)
    if not directory.is_dir():
        return [Check(f"directory {directory}", False, "does not exist or is not a directory")]
    token = f".dj-elastic-doctor-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    first, link, renamed = directory / f"{token}.a", directory / f"{token}.b", directory / f"{token}.c"
    try:
        checks = [_check_exclusive_create(first), _check_hard_link(first, link), _check_rename(first, renamed)]
    finally:
        for leftover in (first, link, renamed):
            with contextlib.suppress(OSError):
                leftover.unlink()
    return checks


def lease_timing_check(job_dir: str | os.PathLike) -> Check:
    """The job's lease TTL and heartbeat against the cache lag of the mount holding it."""
    name = "lease timing vs mount cache"
    mount = mount_of(job_dir)
    if mount is None:
        return Check(
            name, True, "could not read /proc/self/mountinfo: check TTL >= 3 x (cache lag + heartbeat) by hand"
        )
    ttl, heartbeat, source = DEFAULT_LEASE_TTL_SECS, None, "defaults: the job is not prepared"
    try:
        recorded = load_manifest(Path(job_dir)).settings
    except (ElasticError, OSError):  # not prepared (or unreadable: the other commands say why)
        recorded = None
    if recorded is not None:
        ttl = float(recorded.get("lease_ttl_secs") or ttl)
        heartbeat, source = recorded.get("heartbeat_interval_secs"), "the job's"
    advice = advise(mount, ttl, float(heartbeat or ttl / 4), source)
    return Check(name, advice.ok is not False, advice.detail, warn=advice.ok is False)


def _check_exclusive_create(target: Path) -> Check:
    name = "exclusive create (O_EXCL)"
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, b"dj-elastic doctor\n")
        os.close(fd)
    except OSError as exc:
        return Check(name, False, f"cannot create {target}: {exc}")
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return Check(name, True, "a second exclusive create of the same name was refused")
    except OSError as exc:
        return Check(name, False, f"second create failed unexpectedly: {exc}")
    os.close(fd)
    return Check(name, False, "a second exclusive create of an existing file succeeded")


def _check_hard_link(source: Path, link: Path) -> Check:
    name = "hard link"
    try:
        os.link(source, link)
    except OSError as exc:
        hint = " (the filesystem does not support hard links)" if exc.errno in (errno.EPERM, errno.EOPNOTSUPP) else ""
        return Check(name, False, f"link failed: {exc}{hint}")
    try:
        os.link(source, link)
    except FileExistsError:
        pass
    except OSError as exc:
        return Check(name, False, f"linking onto an existing name failed with {exc}, expected EEXIST")
    else:
        return Check(name, False, "linking onto an existing name succeeded")
    same = os.stat(source).st_ino == os.stat(link).st_ino and os.stat(source).st_nlink >= 2
    return Check(name, same, "link() publishes a file once" if same else "the link is not the same file")


def _check_rename(source: Path, target: Path) -> Check:
    name = "rename"
    try:
        target.write_bytes(b"old\n")
        os.replace(source, target)
    except OSError as exc:
        return Check(name, False, f"os.replace failed: {exc}")
    ok = target.read_bytes() == b"dj-elastic doctor\n" and not source.exists()
    return Check(name, ok, "os.replace replaces atomically" if ok else "os.replace left unexpected contents")
