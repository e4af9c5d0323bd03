"""Finalize a job: refuse on terminal failures, publish the export in order, write the overall stats.

Apart from ``executor`` (which imports Data-Juicer): ``dj-elastic merge`` runs exactly this, and
must not pay seconds of Data-Juicer and Ray imports for a file copy with validation.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading

from data_juicer_elastic.console import StepDisplay, say
from data_juicer_elastic.console.summary import run_clock_start, shown_path
from data_juicer_elastic.coordination.flow import shard_failed_error, terminal_failures
from data_juicer_elastic.errors import ConfigError, IntegrityError, storage_errors
from data_juicer_elastic.jobdir.attempts import requeue_hint
from data_juicer_elastic.jobdir.exports import check_export_path, merge_places
from data_juicer_elastic.jobdir.layout import JobLayout, resolve_user_path
from data_juicer_elastic.shards import steps
from data_juicer_elastic.shards.clean import cleaned_export
from data_juicer_elastic.shards.merge import MergeResult, follow_merge, merge_job
from data_juicer_elastic.shards.parts import publish_parts
from data_juicer_elastic.stats import compute_overall, write_overall_stats


def _import_quietly(name: str) -> None:
    with contextlib.suppress(ImportError):  # then the real import reports it where it is needed
        importlib.import_module(name)


@storage_errors(then="run the merge again", places=merge_places)  # ENOSPC, EROFS...: one line naming path and place
def finalize(
    job_dir: str | os.PathLike,
    export_path: str | os.PathLike,
    *,
    overwrite: bool = False,
    stream: bool = False,
    lock_wait_secs: float = 0.0,
    layout: str = "file",
) -> MergeResult:
    """Fail clearly on terminal shard failures, else publish every shard in manifest order and
    write the overall statistics (from the per-shard summaries, not from the export).

    A job whose shard outputs were cleaned (``shards.clean``) publishes nothing: its export is
    re-hashed against merge.json and reported unchanged (or the finalize refused).

    ``layout`` ``file``: one JSONL; with ``stream``, the streaming merge's partial output finished
    (``shards.merge.merge_job``), else a merge from scratch.  ``parts``: the accepted outputs linked into the
    export directory (``shards.parts``; no output is read).
    """
    # pandas formats overall.csv exactly as dj-analyze does; its ~1 s of imports overlap the merge.
    threading.Thread(target=_import_quietly, args=("pandas",), name="dj-elastic-import", daemon=True).start()
    job = resolve_user_path(job_dir)
    export = check_export_path(job, export_path, layout=layout)  # before any work: not in the job dir, ...
    kept = cleaned_export(job, export, layout)  # shard outputs cleaned: only the export can be confirmed
    if kept is not None:
        say(
            f"{kept.rows:,} rows from {kept.shards} shards already in {shown_path(kept.output_path)} (verified; the "
            "shard outputs were cleaned)"
        )
        return kept
    # Terminal failures from the failed/ listing, each read by name (O(failed), not a read of every
    # shard's records: the merge below validates every done marker anyway, and names a missing one).
    failed = terminal_failures(JobLayout(job))
    if failed:
        raise shard_failed_error(failed, job)
    try:  # before merging: a bad summary stops finalize before any output
        overall = compute_overall(job)
    except IntegrityError as exc:  # an accepted output is gone or altered: say how to requeue its shard
        shard = (exc.where or "").removeprefix("shard ")
        if shard == exc.where:
            raise
        raise IntegrityError(exc.message, where=exc.where, hint=requeue_hint(JobLayout(job), [shard])) from None
    if layout == "parts":
        result = publish_parts(job, export, overwrite=overwrite)
    else:
        with StepDisplay(started=run_clock_start(job)) as display, steps.reporting(display):
            result = merge_job(job, export, overwrite, stream=stream, lock_wait_secs=lock_wait_secs)
    write_overall_stats(overall, job, result.output_path)
    say(merged_line(result))
    return result


def merged_line(result: MergeResult) -> str:
    """What finalize did, in one line: it wrote the export, or found it already there, identical."""
    rows, where = f"{result.rows:,} rows from {result.shards} shards", shown_path(result.output_path)
    parts = " as parts" if result.layout == "parts" else ""
    if result.written:
        return f"published {rows}{parts} in {where}" if parts else f"merged {rows} into {where}"
    rewritten = [shown_path(f.path) for f in (result.row_stats, result.quarantined) if f is not None and f.written]
    also = f"; rewrote {' and '.join(rewritten)}, which differed" if rewritten else ""
    return f"{where} already held these {rows}{parts}, identical: left unchanged{also}"


def follow_to_end(job_dir, output, *, overwrite: bool, layout: str, poll_secs: float) -> None:
    """``dj-elastic merge --follow``: the streaming merge beside running workers, a line per step,
    until the export is published (OUTPUT's last component is never resolved: a link is not followed)."""
    if layout == "parts":
        raise ConfigError(
            "--follow streams one merged file; a parts export is published without a merge",
            where="--follow",
            hint="leave out --follow (publishing parts reads no output), or give --export-layout file",
        )

    def show(progress) -> None:
        state = "complete" if progress.complete else "final so far"
        print(
            f"{progress.shards_final}/{progress.num_shards} shards, {progress.rows_final} rows, "
            f"{progress.bytes_final} bytes {state}",
            flush=True,
        )

    result = follow_merge(job_dir, output, overwrite=overwrite, wait=True, poll_secs=poll_secs, on_progress=show)
    print(f"merged {result.rows} rows from {result.shards} shards into {result.output_path}")
