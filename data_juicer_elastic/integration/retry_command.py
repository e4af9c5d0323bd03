"""``dj-elastic retry``: what the next run will check, checked before anything is requeued, and the
commands that finish the job.

The next run's workers refuse operator code that differs from the job's (docs/failure-semantics.md,
"One version of the operator code per job"), and its merge refuses to replace an export it cannot
prove it wrote.  A retry after the user fixed an operator's code would otherwise requeue the shards
and leave them to a run that refuses: so the code is fingerprinted here first.  When it differs,
retry refuses (nothing moved) unless ``--accept-code-change``, which records the new fingerprint for
the requeued shards (``jobdir.retry``) while every other shard is done, so no shard outside
the requeued ones can run under the new code (docs/quarantine.md, "Reprocessing after a fix").
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from data_juicer_elastic.console.summary import shown_path
from data_juicer_elastic.errors import CodeMismatchError, ConfigError, JobDirError, preview
from data_juicer_elastic.execution.code_fingerprint import code_differences, code_fingerprint, version_differences
from data_juicer_elastic.jobdir.exports import MergeRecord, export_changed
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_plan
from data_juicer_elastic.jobdir.records import JobPlan
from data_juicer_elastic.jobdir.retry import CodeChange, change_path, job_code, record_change, retry_shards
from data_juicer_elastic.sharedfs import fsio


@dataclass
class RetryOutcome:
    requeued: list[str]
    code_change: CodeChange | None = None
    notes: list[str] = field(default_factory=list)  # what the user should know before the next run


def retry(
    job_dir: str | Path,
    *,
    shard_ids: list[str] | None = None,
    all_failed: bool = False,
    quarantined: bool = False,
    accept_code_change: bool = False,
) -> RetryOutcome:
    """Check the operator code, then requeue (``jobdir.retry.retry_shards``); CodeMismatchError or
    ConfigError, with nothing moved, when the next run would refuse the requeued shards."""
    job = Path(job_dir).resolve()
    layout, plan = JobLayout(job), load_plan(job)
    named = " ".join(["--shard-id", *(shard_ids or [])])
    mode = "--quarantined" if quarantined else "--all-failed" if all_failed else named
    outcome = RetryOutcome([])

    def check_code(targets: list[str]) -> None:
        outcome.code_change, outcome.notes = _check_code(layout, plan, targets, accept_code_change, mode)

    outcome.requeued = retry_shards(
        job, shard_ids=shard_ids, all_failed=all_failed, quarantined=quarantined, before_requeue=check_code
    )
    return outcome


def _check_code(
    layout: JobLayout, plan: JobPlan, targets: list[str], accept: bool, mode: str
) -> tuple[CodeChange | None, list[str]]:
    """The fingerprint the requeued shards will be checked against: the job's, or (accepted) this node's."""
    recorded = job_code(layout, plan.code)
    if recorded is None:  # a job prepared before fingerprints: its workers check nothing
        return None, []
    here = code_fingerprint(plan.recipe)
    notes = [
        f"this node's versions differ from the job's ({'; '.join(differ)}): run the workers with "
        "--allow-version-mismatch, or with the job's versions"
        for differ in [version_differences(recorded, here)]
        if differ
    ]
    changes = code_differences(recorded, here)
    if not changes:
        return None, notes
    retry_cmd = f"dj-elastic retry --job-dir {shlex.quote(shown_path(layout.root))} {mode}"
    if not accept:
        raise CodeMismatchError(
            "the operator code here differs from the code this job ran: "
            + "; ".join(changes[:4])
            + f"; nothing was requeued (a worker with this code would refuse the {len(targets)} shard(s))",
            where="operator code",
            hint=f"to run the requeued shard(s) with this code (the other shards keep the results their code gave): "
            f"{retry_cmd} --accept-code-change; or restore the job's code; or prepare a new job_dir for the new code",
        )
    requeued = set(targets)
    others = [s for s in plan.shard_ids if s not in requeued and not fsio.exists(layout.done(s))]
    if others:
        raise ConfigError(
            f"{len(others)} shard(s) are neither done nor requeued ({preview(others)}): they would run the new "
            "code unrecorded; nothing was requeued",
            where=str(layout.root),
            hint="finish the job with its code first (then accept the change), or prepare a new job_dir for the "
            "new code",
        )
    code = {**here, "versions": recorded.get("versions", here["versions"])}  # a code change, never a version one
    return record_change(layout, code, targets, changes), notes


def next_steps(job_dir: str | Path, outcome: RetryOutcome) -> list[str]:
    """What retry prints: what it did, and the exact commands that finish the job."""
    layout = JobLayout(Path(job_dir).resolve())
    if not outcome.requeued:
        return ["requeued 0 shard(s): -"]
    lines = [f"requeued {len(outcome.requeued)} shard(s): {', '.join(outcome.requeued)}"]
    change = outcome.code_change
    if change is not None:
        record = shown_path(change_path(layout, change.seq))
        lines.append(f"they run with this operator code from now on ({record}): " + "; ".join(change.changes[:4]))
    lines += [f"note: {note}" for note in outcome.notes]
    job = shlex.quote(shown_path(layout.root))
    try:
        merged = MergeRecord.read(layout.merge_record)
    except JobDirError:  # a damaged record: the export is not known
        merged = None
    export = shlex.quote(shown_path(merged.output_path)) if merged is not None else "<export_path>"
    changed = export_changed(layout)
    if merged is not None and merged.layout == "parts" and fsio.exists(Path(merged.output_path)):
        changed = Path(merged.output_path)  # a parts export is replaced only with overwrite (jobdir.exports)
    force = " --overwrite" if changed is not None else ""
    merge = f"dj-elastic merge --job-dir {job} --output {export}{force}"
    lines.append(f"next: dj-elastic worker --job-dir {job} && {merge}")
    lines.append(
        "  or: the job's own dj-process command again (dj-process --config <its recipe>"
        + (" --elastic.overwrite_output true" if changed is not None else "")
        + "): it runs only the requeued shard(s), then replaces the export"
    )
    if changed is not None:
        parts = merged is not None and merged.layout == "parts"
        why = "is a parts export" if parts else "changed since this job wrote it"
        what = f"{shown_path(changed)} {why}"
        lines.append(f"note: {what}: a merge replaces it only with --overwrite")
    return lines
