"""How a job's scans ended, for a job that has a plan and no manifest yet: the whole input accepted
(every shard's scan read back), refused (the first refusal in input order, as one error naming
``file:line``), or a scan's budget spent.  The scan phase's settle raises the error
(``worker.settle_scans``); every reader of the manifest (``manifest.load_manifest``: verify, the
report, merge, retry) raises it too once every scan has ended, so that none of them sends the user
to start workers that would only refuse the input again (docs/input-format.md).
"""

from __future__ import annotations

from data_juicer_elastic.errors import ElasticError, InputChangedError, InputError, JobDirError, ShardFailedError
from data_juicer_elastic.jobdir.attempts import read_done
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.plan_records import JobPlan, PlannedShard, ScanResult
from data_juicer_elastic.jobdir.shard_state import terminal_infos
from data_juicer_elastic.sharedfs import fsio


def scans_verdict(layout: JobLayout, plan: JobPlan) -> tuple[ElasticError | None, dict[str, ScanResult]]:
    """Once every shard's scan has ended: (the job's error, {}) when a scan failed terminally or
    refused the input, else (None, every accepted scan)."""
    failed = terminal_infos(layout.scans, plan.shard_ids)
    if failed:
        shown = "; ".join(f"{shard}: {why}" for shard, why in failed[:3])
        error = ShardFailedError(
            f"the scan of {len(failed)} shard(s) failed terminally: {shown}",
            where=str(layout.scans.failed_dir),
            hint="fix the cause (see the scan attempts' logs), then prepare a new job_dir",
        )
        return error, {}
    results = read_scans(layout, plan)
    refused = refusal_error(plan, results)
    return (refused, {}) if refused is not None else (None, results)


def ended_scans_error(layout: JobLayout, plan: JobPlan) -> ElasticError | None:
    """The error that ended the scans of a job without a manifest, for a reader of the job (worded
    as what happened to the job); None while any shard's scan has not ended (more workers scan it),
    or when none refused the input.  One listing each of ``scans/done`` and ``scans/failed`` decides
    whether to read further."""
    listed = {*fsio.list_names(layout.scans.done_dir), *fsio.list_names(layout.scans.failed_dir)}
    if any(f"{shard}.json" not in listed for shard in plan.shard_ids):
        return None
    error, _ = scans_verdict(layout, plan)
    if error is None or isinstance(error, ShardFailedError):
        return error
    hint = f"{error.hint}; then" if error.hint else "fix the input, then"
    return type(error)(
        f"the job's scan refused its input: {error.message}",
        where=error.where,
        hint=f"{hint} run the job again with a new job_dir, or remove {layout.root} first: workers started on "
        "this one only refuse it again",
    )


def read_scans(layout: JobLayout, plan: JobPlan) -> dict[str, ScanResult]:
    """Every shard's accepted scan, read by name (one read each); JobDirError naming the first
    marker that is corrupt (checksum, format, a foreign shard), missing, or not of its planned shard."""
    results = {}
    for entry in plan.shards:
        where = str(layout.scans.done(entry.shard_id))
        result, error = read_done(layout.scans, entry.shard_id)
        if error is not None:
            raise JobDirError(
                f"corrupt scan record: {error}",
                where=where,
                hint="delete that record to scan the shard again (dj-elastic worker), or prepare a new job_dir",
            )
        if result is None:
            raise JobDirError(f"shard {entry.shard_id} is not scanned yet", where=where)
        assert isinstance(result, ScanResult)
        _check_against_plan(plan, entry, result, where)
        results[entry.shard_id] = result
    return results


def _check_against_plan(plan: JobPlan, entry: PlannedShard, result: ScanResult, where: str) -> None:
    if result.refusal is not None:
        return  # a refusal stops at its span; the job is refused with it
    if len(result.span_rows) != len(entry.spans) or sum(result.span_rows) != result.rows:
        raise JobDirError(f"scan record of {entry.shard_id} does not match the plan's spans", where=where)
    plain = all(plan.inputs[s.input].codec == "none" for s in entry.spans)
    if plain and result.bytes < entry.bytes:
        raise JobDirError(f"scan record of {entry.shard_id} holds fewer bytes than its spans", where=where)
    if plan.copy_shards and result.copy is None:
        raise JobDirError(f"scan record of {entry.shard_id} names no copy, but the job copies shards", where=where)


def refusal_error(plan: JobPlan, results: dict[str, ScanResult]) -> ElasticError | None:
    """The job's input error: the first refusal in input order, as one error naming ``file:line``."""
    rows_before: dict[int, int] = {}  # rows of each input file in the spans before this one
    for entry in plan.shards:
        result = results[entry.shard_id]
        for number, span in enumerate(entry.spans):
            refusal = result.refusal
            if refusal is not None and refusal.span == number:
                path = plan.inputs[span.input].path
                where = path if refusal.line is None else f"{path}:{rows_before.get(span.input, 0) + refusal.line}"
                kind = InputChangedError if refusal.error_type == InputChangedError.__name__ else InputError
                return kind(refusal.message, where=where, hint=refusal.hint)
            rows_before[span.input] = rows_before.get(span.input, 0) + result.span_rows[number]
    return None
