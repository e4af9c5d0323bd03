"""Requeue shards with a fresh retry budget: terminally failed ones, and done ones whose accepted
result is gone or corrupt (or, with ``quarantined``, set rows aside: ``jobdir.row_errors``).  The
records are moved (never deleted) to ``history/<shard>/<stamp>/`` (docs/failure-semantics.md,
"Requeueing a done shard whose output is gone"): failure records first, the marker last, so a crash
in between leaves the shard still failed (or done) and running retry again finishes the job.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from data_juicer_elastic.errors import ConfigError, IntegrityError, JobDirError
from data_juicer_elastic.jobdir import attempts, confine, task_queue
from data_juicer_elastic.jobdir.cleaned import cleaned_error, read_cleaned
from data_juicer_elastic.jobdir.layout import JobLayout, parse_gen_name, validate_shard_id
from data_juicer_elastic.jobdir.lease_records import Release
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.reasons import ReleaseReason, TakeoverReason
from data_juicer_elastic.jobdir.records import Manifest
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
    operator code: ``integration.retry_command``); an error there leaves the job as it was."""
    if sum((bool(shard_ids), bool(all_failed), bool(quarantined))) != 1:
        raise ConfigError(
            "name the shards to retry, or ask for all failed shards, or for the shards with quarantined rows "
            "(one of them)",
            where="retry",
            hint="use --shard-id ID (repeatable), --all-failed or --quarantined",
        )
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    if (cleaned := read_cleaned(layout)) is not None:  # a shard run again could never be merged with the others
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
    confine.ensure_dir(layout, dest / "failures")
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
        confine.ensure_dir(layout, layout.release_dir(shard))
        claim_view = task_queue.read_lease(layout, shard)
        attempt_id = claim_view.claim.attempt_id if claim_view.claim else "unknown"
        record = Release(shard, latest, attempt_id, ReleaseReason.RETRY, time.time())
        fsio.publish_bytes(layout.release(shard, latest), record.encode())
    fsio.move(layout.failed(shard), dest / "failed.json")
