"""``dj-elastic clean``: keep a finished job's output once, in its export (docs/output-layouts.md, "Cleaning a
finished job").

Order: everything is checked (``verify_job``, every byte), then ``clean.json`` is written, then files are
removed, then the record says complete.  A clean stopped anywhere leaves either a job that was never cleaned
or one every reader treats as cleaned (``jobdir.exports``); running clean again finishes it.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from loguru import logger

from data_juicer_elastic.dedup.phase_records import CLUSTER_KIND, read_phase_record
from data_juicer_elastic.dedup.stages import dedup_stages, stage_identity
from data_juicer_elastic.errors import IntegrityError, JobDirError, storage_errors
from data_juicer_elastic.jobdir.attempts import OUTPUT_FILE
from data_juicer_elastic.jobdir.exports import CleanRecord, MergedSideFile, MergeRecord, cleaned_error
from data_juicer_elastic.jobdir.layout import JobLayout, check_inside, check_layout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import Manifest
from data_juicer_elastic.shards.merge import MergeResult, accepted_results
from data_juicer_elastic.shards.side_files import ATTEMPT_FILES
from data_juicer_elastic.shards.verify import ExportSummary, verify_export, verify_job
from data_juicer_elastic.sharedfs import fsio

# What an attempt directory holds that the export holds too (the rest: records, logs, stats summaries, kept).
ATTEMPT_OUTPUTS = (OUTPUT_FILE, *ATTEMPT_FILES)


@dataclass(frozen=True)
class CleanResult:
    export: ExportSummary  # the export, verified before anything was removed (or, when cleaned before, again)
    files: int  # removed now
    bytes_freed: int  # their sizes, counting only files that had no other name (a part is the same file)
    earlier: CleanRecord | None  # a clean that had started before (stopped, or finished: ``complete``)

    @property
    def how(self) -> str:
        """What this clean was, when not the first: said after the export's PASS line."""
        if self.earlier is None:
            return ""
        return " (cleaned before)" if self.earlier.complete else " (finishing a clean that was stopped)"

    def lines(self, job_dir: str) -> list[str]:
        """What ``dj-elastic clean`` prints."""
        out = self.export
        return [
            f"PASS: export {out.path} ({out.layout}: {out.rows} rows, {out.bytes} bytes) verified{self.how}",
            f"cleaned {job_dir}: removed {self.files} file(s), freed {self.bytes_freed:,} bytes",
        ]


@storage_errors(then="run `dj-elastic clean` again: it finishes what it started")
def clean_job(job_dir: str | Path) -> CleanResult:
    """Remove the shard outputs of a finished job whose export verifies; refuse (JobDirError, IntegrityError:
    exit 2) a job that is not finished, has no export, or does not verify."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    check_layout(layout)
    earlier = CleanRecord.read(layout.clean_record)
    try:
        verified = verify_job(layout.root)  # every input, result and export byte; a cleaned job: the export
    except (IntegrityError, JobDirError) as exc:  # nothing (more) is removed from a job that does not verify
        refused = "not cleaned" if earlier is None else "cleaned before"
        raise type(exc)(f"{refused}: {exc.message}", where=exc.where, hint=exc.hint) from None
    if verified.export is None:
        raise JobDirError(
            "not cleaned: the job has no export yet (no merge.json); the shard outputs are all there is of its result",
            where=str(layout.root),
            hint=f"publish it first (`dj-elastic merge --job-dir {layout.root} --output OUT`, or run the recipe "
            "again), then clean",
        )
    record = earlier
    if record is None:
        merge = MergeRecord.read(layout.merge_record)
        assert merge is not None  # the export was just verified from it
        record = CleanRecord(manifest.job_id, merge.output_path, merge.layout, merge.sha256, time.time())
        fsio.atomic_write(layout.clean_record, record.encode())  # before the first removal: see jobdir.exports
    files = freed = 0
    for path in (*_reclaimable(layout, manifest.copy_shards), *_dedup_intermediates(layout, manifest)):
        size = _remove(path)
        if size is not None:
            files, freed = files + 1, freed + size
    if not record.complete or files:
        done = replace(record, complete=True, files=record.files + files, bytes_freed=record.bytes_freed + freed)
        fsio.atomic_write(layout.clean_record, done.encode())
    logger.info(f"cleaned {layout.root}: removed {files} file(s), {freed} bytes freed")
    return CleanResult(verified.export, files, freed, earlier)


def _reclaimable(layout: JobLayout, copies: bool) -> Iterator[Path]:
    """Every attempt's outputs (the accepted ones are in the export; the others were never accepted), and the
    input shard copies with their scan attempts' names for them (``copy_shards``)."""
    places = [(layout.attempts_dir, ATTEMPT_OUTPUTS)]
    if copies:
        places.append((layout.scans.attempts_dir, ()))
    for attempts_dir, names in places:
        for shard in fsio.list_names(attempts_dir):
            for attempt in fsio.list_names(attempts_dir / shard):
                directory = check_inside(layout, attempts_dir / shard / attempt)  # no planted link out
                for name in fsio.list_names(directory):
                    if name in names or (not names and name.startswith("shard.jsonl")):
                        yield directory / name
    if copies:
        shards = check_inside(layout, layout.shards_dir)
        yield from (shards / name for name in fsio.list_names(shards) if ".jsonl" in name)


def _dedup_intermediates(layout: JobLayout, manifest: Manifest) -> Iterator[Path]:
    """The deduplication phases' intermediate files of every decided stage (its ``cluster.json`` checks for
    this recipe): the signature files, the edge files, and the files a refusal set aside.  What stays: each
    stage's ``cluster.json``, drop lists and bucket plan (what a rerun of the cleaned job checks, the counts
    ``merge.json`` and status show), and the phases' attempt records and logs."""
    for stage in dedup_stages(manifest.recipe.get("process") or []):
        try:
            marker = read_phase_record(layout.dedup_cluster(stage.number), CLUSTER_KIND,
                                       stage_identity(manifest.recipe_hash, stage))  # fmt: skip
        except IntegrityError:
            marker = None
        if marker is None:
            continue  # not decided for this recipe: nothing of it is judged here
        base = check_inside(layout, layout.dedup_stage(stage.number))
        for folder, suffix in (("signatures", ".sig"), ("edges", ".edges"), ("drops", None), ("buckets", None)):
            for name in fsio.list_names(base / folder):
                if (name.startswith(".") and ".refused-" in name) or (suffix and name.endswith(suffix)):
                    yield base / folder / name


def _remove(path: Path) -> int | None:
    """Remove one file; the bytes that frees (0 when another name keeps it), None when it is not a file."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    fsio.remove(path)
    return found.st_size if found.st_nlink == 1 else 0


def cleaned_export(job_dir: str | Path, export: Path, layout_name: str) -> MergeResult | None:
    """What finalizing a cleaned job (a rerun of the recipe, ``dj-elastic merge``) does: the export the job
    published, checked in full and reported unchanged; a refusal when another export is asked for, or when it
    no longer verifies.  None when the job was not cleaned (finalize merges as usual)."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    record = CleanRecord.read(layout.clean_record)
    if record is None:
        return None
    if (Path(record.output_path), record.layout) != (export, layout_name):
        raise cleaned_error(layout, record, f"publishing the export ({layout_name}) at {export}")
    manifest = load_manifest(layout.root)
    merge = MergeRecord.read(layout.merge_record)
    if merge is None or merge.sha256 != record.merge_sha256:
        raise IntegrityError(
            "merge.json is missing or is not the record of the export that was verified before the shard outputs "
            "were cleaned",
            where=str(layout.merge_record),
            hint="the job directory was modified after clean; run the recipe with a new job_dir",
        )
    summary = verify_export(layout, manifest, accepted_results(layout, manifest), {}, cleaned=True)
    assert summary is not None
    quarantined = None
    if merge.errors_path and merge.errors_sha256:
        errors = Path(merge.errors_path)
        quarantined = MergedSideFile(errors, merge.errors_rows, errors.stat().st_size, merge.errors_sha256, False)
    return MergeResult(
        export, summary.rows, summary.bytes, merge.sha256, len(merge.shards), False, None, quarantined, merge.layout
    )
