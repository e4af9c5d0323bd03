"""Requeue shards with a fresh retry budget (``dj-elastic retry``), the operator code a retry accepted
(``code-changes/<seq>.json``), and what changed between two recipes, said in the recipe's own terms.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from loguru import logger

from data_juicer_elastic.errors import ConfigError, IntegrityError, JobDirError, clip
from data_juicer_elastic.jobdir import attempts, task_queue
from data_juicer_elastic.jobdir.exports import CleanRecord, cleaned_error
from data_juicer_elastic.jobdir.layout import JobLayout, ensure_dir, parse_gen_name, validate_shard_id
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import ChecksummedRecord, Manifest, Release, ReleaseReason, TakeoverReason
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity


def retry_shards(
    job_dir: str | Path,
    shard_ids: list[str] | None = None,
    all_failed: bool = False,
    quarantined: bool = False,
    before_requeue: Callable[[list[str]], None] | None = None,
) -> list[str]:
    """Requeue the given shards (failed, or done with an invalid result), every failed shard, or
    every done shard with quarantined rows; returns the ids requeued.  ``before_requeue(ids)`` runs
    once every shard is checked and before any record moves: what the next run will check (its
    operator code: ``integration.retry_command``); an error there leaves the job as it was.  The records
    are moved (never deleted) to ``history/<shard>/<stamp>/``: failure records first, the marker last, so
    a crash in between leaves the shard still failed (or done) and running retry again finishes the job."""
    if sum((bool(shard_ids), bool(all_failed), bool(quarantined))) != 1:
        raise ConfigError(
            "name the shards to retry, or ask for all failed shards, or for the shards with quarantined rows "
            "(one of them)",
            where="retry",
            hint="use --shard-id ID (repeatable), --all-failed or --quarantined",
        )
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    if (
        cleaned := CleanRecord.read(layout.clean_record)
    ) is not None:  # a shard run again could never be merged with the others
        raise cleaned_error(layout, cleaned, "running shards again")
    if quarantined:
        targets = _quarantined(layout, manifest)
    elif all_failed:
        targets = [s for s in manifest.shard_ids if fsio.exists(layout.failed(s))]
    else:
        targets, known = list(dict.fromkeys(shard_ids or [])), set(manifest.shard_ids)
        for shard in targets:
            validate_shard_id(shard)
            if shard not in known:
                raise JobDirError(
                    f"unknown shard {shard}: this job has {manifest.num_shards} shards",
                    where=str(layout.root),
                    hint=f"ids run from {manifest.shard_ids[0]} to {manifest.shard_ids[-1]}",
                )
    # check all before moving anything
    done = set(targets) if quarantined else {s for s in targets if _done_and_invalid(layout, manifest, s)}
    if targets and before_requeue is not None:
        before_requeue(targets)
    for shard in targets:
        _archive(layout, shard, done=shard in done)
    if targets:
        what = " with quarantined rows" if quarantined else ""
        logger.info(f"requeued {len(targets)} shard(s){what}: {', '.join(targets)}")
    return targets


def _done_and_invalid(layout: JobLayout, manifest: Manifest, shard: str) -> bool:
    """False for a failed shard, True for a done one whose accepted result does not validate (the
    only done shard that may be requeued); JobDirError for any other."""
    if not fsio.exists(layout.done(shard)):
        if fsio.exists(layout.failed(shard)):
            return False
        raise JobDirError(
            f"shard {shard} is not failed",
            where=str(layout.root),
            hint="retry requeues shards in state failed, or done shards whose output is missing or corrupt "
            "(dj-elastic verify names them)",
        )
    result, error = attempts.read_done(layout, shard)
    if result is None:
        logger.warning(f"{shard}: requeueing a corrupt done marker: {error}")
        return True
    try:
        attempts.validate_result(layout, manifest.shard(shard), result)
    except IntegrityError as exc:
        logger.warning(f"{shard}: requeueing a done shard whose result is invalid: {exc}")
        return True
    raise JobDirError(
        f"shard {shard} is done and its output is valid; nothing to retry",
        where=str(layout.root),
        hint="retry requeues failed shards, and done shards whose output is missing or corrupt",
    )


def _quarantined(layout: JobLayout, manifest: Manifest) -> list[str]:
    """Done shards whose accepted (and valid) result set rows aside."""
    found = []
    for shard in attempts.list_done(layout):
        result, error = attempts.read_done(layout, shard)
        if result is None or result.errors is None or not result.errors.rows:
            continue
        attempts.validate_result(layout, manifest.shard(shard), result)  # IntegrityError names a broken one
        found.append(shard)
    return sorted(found, key=manifest.shard_ids.index)


def _archive(layout: JobLayout, shard: str, *, done: bool) -> None:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{secrets.token_hex(3)}"
    dest = layout.history(shard) / stamp
    ensure_dir(layout, dest / "failures")
    latest = task_queue.latest_generation(layout, shard)
    for name in fsio.list_names(layout.failure_dir(shard)):
        if parse_gen_name(name) is not None:
            fsio.move(layout.failure_dir(shard) / name, dest / "failures" / name)
    if done:
        # The holder of the latest generation released it as "finished", which others honour
        # for a TTL (a lagging cache may hide a done marker).  A generation of our own, claimed
        # and released at once, makes the shard claimable now; then the marker goes.
        view = task_queue.read_lease(layout, shard)
        identity = WorkerIdentity.current()
        claim = task_queue.publish_claim(layout, view, identity, identity.new_attempt_id(), TakeoverReason.RETRY)
        if claim is not None:
            task_queue.release_claim(layout, claim, ReleaseReason.RETRY)
        if fsio.exists(layout.failed(shard)):
            fsio.move(layout.failed(shard), dest / "failed.json")
        fsio.move(layout.done(shard), dest / "done.json")
        return
    # The latest generation's failure record just moved away; without a release it
    # would look held until a TTL passes.  Its holder is gone (the shard was failed),
    # so record the release on its behalf.
    if latest and not fsio.exists(layout.release(shard, latest)):
        ensure_dir(layout, layout.release_dir(shard))
        claim_view = task_queue.read_lease(layout, shard)
        attempt_id = claim_view.claim.attempt_id if claim_view.claim else "unknown"
        record = Release(shard, latest, attempt_id, ReleaseReason.RETRY, time.time())
        fsio.publish_bytes(layout.release(shard, latest), record.encode())
    fsio.move(layout.failed(shard), dest / "failed.json")


_NAME: Final = re.compile(r"^(\d{6})\.json$")


@dataclass(frozen=True)
class CodeChange(ChecksummedRecord):
    """Operator code ``retry --accept-code-change`` accepted for the shards it requeued: from then on
    workers check their code against the latest record instead of the manifest's (docs/failure-semantics.md,
    "One version of the operator code per job").  Published with ``link()`` (first wins), never rewritten;
    a damaged one is an error naming it, never a silent fall-back to older code."""

    KIND: ClassVar[str] = "code-change"
    seq: int  # 1, 2, ...: the latest is the job's code
    code: dict[str, Any]  # the fingerprint workers now check against (execution.code_fingerprint)
    shards: list[str]  # the shards requeued to run under it
    changes: list[str] = field(default_factory=list)  # what differed from the code before, as retry showed it
    accepted_at: float = 0.0
    by: str = ""  # node and pid of the retry
    checksum: str | None = None


def change_path(layout: JobLayout, seq: int) -> Path:
    return layout.code_changes_dir / f"{seq:06d}.json"


def latest_change(layout: JobLayout) -> CodeChange | None:
    """The latest accepted change, or None; JobDirError naming a damaged record."""
    seqs = [int(m.group(1)) for m in map(_NAME.match, fsio.list_names(layout.code_changes_dir)) if m]
    seq, data = max(seqs, default=0), None
    if seq:
        data = fsio.read_record(change_path(layout, seq))
        if data is None:  # listed, then gone: records are never removed, so the directory was edited
            path = change_path(layout, seq)
            raise JobDirError("code-change record vanished while read", where=str(path), hint="prepare a new job_dir")
    # A listing may lag on NFS; a name opened is current: the records after the listed ones are probed.
    while (newer := fsio.read_record(change_path(layout, seq + 1))) is not None:
        seq, data = seq + 1, newer
    if data is None:
        return None
    path = change_path(layout, seq)
    try:
        return CodeChange.parse_checked(data, path)
    except JobDirError as exc:
        raise JobDirError(
            exc.message,
            where=str(path),
            hint="the operator code this job runs is unknown: prepare a new job_dir (or restore the record)",
        ) from None


def job_code(layout: JobLayout, prepared: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fingerprint a worker must match: the latest accepted change's, else the one prepare recorded."""
    change = latest_change(layout)
    return prepared if change is None else change.code


def record_change(layout: JobLayout, code: dict[str, Any], shards: list[str], changes: list[str]) -> CodeChange:
    """Publish the next change record (before any shard is requeued under it)."""
    latest = latest_change(layout)
    seq = 1 if latest is None else latest.seq + 1
    me = WorkerIdentity.current()
    record = CodeChange(seq, dict(code), list(shards), list(changes), time.time(), f"{me.node_id} pid {me.pid}")
    ensure_dir(layout, layout.code_changes_dir)
    path = change_path(layout, seq)
    if not fsio.publish_bytes(path, record.encode()):
        raise JobDirError(
            "another retry recorded a code change at the same time",
            where=str(path),
            hint="run the retry again: it checks the job as it is now",
        )
    return record


MAX_CHANGES: Final = 8
MAX_VALUE_CHARS: Final = 60
_ABSENT: Final = object()


def recipe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every difference, at most ``MAX_CHANGES`` (then "... N more"), as a user finds it in the YAML
    (``process[1] text_length_filter.min_len: 10 -> 20``, ``text_keys: 'text' -> 'content'``).  Operators
    are matched by name in order (``difflib``): inserting one reports that insertion, not a change of
    every operator after it."""
    changes: list[str] = []
    for key in sorted(set(old) | set(new)):
        if key == "process":
            changes += _process_changes(old.get(key) or [], new.get(key) or [])
        else:
            _value_changes(key, old.get(key, _ABSENT), new.get(key, _ABSENT), changes)
    if len(changes) > MAX_CHANGES:
        changes = changes[:MAX_CHANGES] + [f"... {len(changes) - MAX_CHANGES} more"]
    return changes


def _process_changes(old: list[Any], new: list[Any]) -> list[str]:
    old_ops, new_ops = [_op(item) for item in old], [_op(item) for item in new]
    matcher = difflib.SequenceMatcher(a=[name for name, _ in old_ops], b=[name for name, _ in new_ops], autojunk=False)
    changes: list[str] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for (name, before), position, (_, after) in zip(old_ops[i1:i2], range(j1, j2), new_ops[j1:j2], strict=True):
                _value_changes(f"process[{position}] {name}", before, after, changes)
            continue
        changes += [f"process[{position}] {old_ops[position][0]}: removed" for position in range(i1, i2)]
        changes += [f"process[{position}] {new_ops[position][0]}: added" for position in range(j1, j2)]
    return changes


def _op(item: Any) -> tuple[str, Any]:
    """``{"name": {args}}`` (the shard recipe's form) -> (name, args)."""
    if isinstance(item, dict) and len(item) == 1:
        ((name, args),) = item.items()
        return str(name), args
    return repr(item), None


def _value_changes(path: str, before: Any, after: Any, changes: list[str]) -> None:
    if before == after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after), key=str):
            _value_changes(f"{path}.{key}", before.get(key, _ABSENT), after.get(key, _ABSENT), changes)
        return
    changes.append(f"{path}: {_shown(before)} -> {_shown(after)}")


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    try:
        text = repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):  # not JSON data
        text = repr(value)
    return clip(text, MAX_VALUE_CHARS)


def recipe_differences(
    manifest: Manifest,
    recipe: dict[str, Any],
    rhash: str,
    stage_identities: list[str] | None = None,
    versions: dict[str, str] | None = None,
) -> list[str]:
    """How ``recipe`` (and its operators' identities) differ from the job's, in recipe terms."""
    if manifest.recipe_hash != rhash:
        changes = recipe_changes(manifest.recipe, recipe) or [f"recipe hash {manifest.recipe_hash} -> {rhash}"]
        return ["the recipe changed: " + "; ".join(changes)]
    if stage_identities is None or list(manifest.stage_identities) == list(stage_identities):
        return []
    # Same recipe text, other operator code: a Data-Juicer upgrade or a changed custom operator.
    old, new = list(manifest.stage_identities), list(stage_identities)
    changed = [n.split(":", 1)[-1] for o, n in zip(old, new, strict=False) if o != n] or ["the operator list"]
    before, now = (manifest.versions or {}).get("data_juicer"), (versions or {}).get("data_juicer")
    upgrade = f" (Data-Juicer {before} -> {now})" if before and now and before != now else ""
    return [f"the operators' code changed{upgrade}: {', '.join(changed)} would compute differently"]
