"""Requeue terminally failed shards with a fresh retry budget.

The failure records and the failed marker are *moved* (never deleted) to
``history/<shard>/<stamp>/``, so the evidence survives and the shard's failure
count restarts at zero.  Failure records move first and the marker last: a crash
in between leaves a shard that is still failed, and running retry again finishes
the job.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from loguru import logger

from data_juicer_elastic.errors import ConfigError, JobDirError
from data_juicer_elastic.jobdir import confine, fsio, leases
from data_juicer_elastic.jobdir.layout import JobLayout, parse_gen_name, validate_shard_id
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import Release


def retry_shards(job_dir: str | Path, shard_ids: list[str] | None = None, all_failed: bool = False) -> list[str]:
    """Requeue the given failed shards (or every failed shard); returns the ids requeued."""
    if bool(shard_ids) == bool(all_failed):
        raise ConfigError(
            "name the shards to retry or ask for all failed shards (not both, not neither)",
            where="retry",
            hint="use --shard-id ID (repeatable) or --all-failed",
        )
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    known = set(manifest.shard_ids)
    if all_failed:
        targets = [s for s in manifest.shard_ids if fsio.exists(layout.failed(s))]
    else:
        targets = []
        for shard in dict.fromkeys(shard_ids or []):
            validate_shard_id(shard)
            if shard not in known:
                raise JobDirError(
                    f"unknown shard {shard}: this job has {manifest.num_shards} shards",
                    where=str(layout.root),
                    hint=f"ids run from {manifest.shard_ids[0]} to {manifest.shard_ids[-1]}",
                )
            targets.append(shard)
    for shard in targets:  # check all before moving anything
        if fsio.exists(layout.done(shard)):
            raise JobDirError(f"shard {shard} is done; only failed shards can be retried", where=str(layout.root))
        if not fsio.exists(layout.failed(shard)):
            raise JobDirError(
                f"shard {shard} is not failed",
                where=str(layout.root),
                hint="retry only requeues shards in state failed (see dj-elastic status)",
            )
    for shard in targets:
        _archive(layout, shard)
    if targets:
        logger.info(f"requeued {len(targets)} shard(s): {', '.join(targets)}")
    return targets


def _archive(layout: JobLayout, shard: str) -> None:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{secrets.token_hex(3)}"
    dest = layout.history(shard) / stamp
    confine.ensure_dir(layout, dest / "failures")
    latest = leases.latest_generation(layout, shard)
    for name in fsio.list_names(layout.failure_dir(shard)):
        if parse_gen_name(name) is not None:
            fsio.move(layout.failure_dir(shard) / name, dest / "failures" / name)
    # The latest generation's failure record just moved away; without a release it
    # would look held until a TTL passes.  Its holder is gone (the shard was failed),
    # so record the release on its behalf.
    if latest and not fsio.exists(layout.release(shard, latest)):
        confine.ensure_dir(layout, layout.release_dir(shard))
        claim_view = leases.read_lease(layout, shard)
        attempt_id = claim_view.claim.attempt_id if claim_view.claim else "unknown"
        record = Release(shard, latest, attempt_id, "retry", time.time())
        fsio.publish_bytes(layout.release(shard, latest), record.encode())
    fsio.move(layout.failed(shard), dest / "failed.json")
