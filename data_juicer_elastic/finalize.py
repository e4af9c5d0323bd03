"""Finalize a job: refuse on terminal failures, merge every shard in order, write the overall stats.

Its own module, apart from ``executor`` (which subclasses Data-Juicer's executor base
and so imports Data-Juicer): ``dj-elastic merge`` runs exactly this, and must not pay
seconds of Data-Juicer and Ray imports for a file copy with validation.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading

from data_juicer_elastic.console import StepDisplay, say
from data_juicer_elastic.console.summary import shown_path
from data_juicer_elastic.coordination import crashpoints
from data_juicer_elastic.coordination.settle import shard_failed_error
from data_juicer_elastic.errors import IntegrityError, MergeBusyError, storage_errors
from data_juicer_elastic.jobdir.attempts import requeue_hint
from data_juicer_elastic.jobdir.export_path import check_export_path, merge_places
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.preparation import resolve_user_path
from data_juicer_elastic.shards import steps
from data_juicer_elastic.shards.merge import MergeResult, merge_job
from data_juicer_elastic.shards.stream_merge import follow_merge
from data_juicer_elastic.status.job_status import snapshot


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
) -> MergeResult:
    """Fail clearly on terminal shard failures, else merge every shard in manifest order and
    write the overall statistics (from the per-shard summaries, not from the merged file).

    ``stream``: continue the streaming merge's partial output (``shards.stream_merge``);
    if another process still holds it after ``lock_wait_secs``, merge from scratch instead.
    """
    from loguru import logger

    from data_juicer_elastic.stats import compute_overall, write_overall_stats

    crashpoints.install_from_env()
    # pandas formats overall.csv exactly as dj-analyze does; its ~1 s of imports overlap the merge.
    threading.Thread(target=_import_quietly, args=("pandas",), name="dj-elastic-import", daemon=True).start()
    job = resolve_user_path(job_dir)
    export = check_export_path(job, export_path)  # before any work: not in the job dir, not a directory
    snap = snapshot(job)
    if snap.terminal_failures:
        raise shard_failed_error(snap.terminal_failures, job)
    try:  # before merging: a bad summary stops finalize before any output
        overall = compute_overall(job)
    except IntegrityError as exc:  # an accepted output is gone or altered: say how to requeue its shard
        shard = (exc.where or "").removeprefix("shard ")
        if shard == exc.where:
            raise
        raise IntegrityError(exc.message, where=exc.where, hint=requeue_hint(JobLayout(job), [shard])) from None
    with StepDisplay() as display, steps.reporting(display):
        result = None
        if stream:
            try:
                result = follow_merge(job, export, overwrite=overwrite, wait=False, lock_wait_secs=lock_wait_secs)
            except MergeBusyError as exc:
                logger.warning(f"{exc}; merging without the partial output")
        if result is None:
            result = merge_job(job, export, overwrite=overwrite)
    write_overall_stats(overall, job, result.output_path)
    say(f"merged {result.rows:,} rows from {result.shards} shards into {shown_path(result.output_path)}")
    return result
