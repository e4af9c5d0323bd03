"""Check a finished job without writing anything: every input shard's content hashed again, every shard done
and valid, enough distinct nodes (multi-node runs), and the export merge.json records (``shards.export_check``).

A cleaned job (``shards.clean``: its shard outputs and shard copies removed) is checked from what is left: the
inputs read in place, every done marker against merge.json, and every byte of the export against the hashes
merge.json recorded (each shard's range against its accepted output's sha256)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from data_juicer_elastic.errors import IntegrityError, JobDirError
from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.exports import CleanRecord, MergeRecord
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import check_shard_file, load_manifest
from data_juicer_elastic.jobdir.records import Manifest
from data_juicer_elastic.rows.shard_source import iter_content
from data_juicer_elastic.shards.export_check import ExportSummary, FileId, verify_export
from data_juicer_elastic.shards.merge import accepted_results
from data_juicer_elastic.shards.plan import added_inputs_note


@dataclass(frozen=True)
class VerifyResult:
    shards: int
    input_rows: int
    output_rows: int
    nodes: list[str]  # distinct node ids of the accepted results, sorted
    shards_by_node: dict[str, int]
    export: ExportSummary | None = None  # the export merge.json records, checked; None before any merge
    added_inputs_note: str | None = None  # files added to a directory input after its plan: the job did not read them

    def lines(self) -> list[str]:
        """What ``dj-elastic verify`` prints."""
        nodes = f"{len(self.nodes)} node(s): {', '.join(self.nodes)}"
        lines = [f"PASS: {self.shards} shards were completed by {nodes}"]
        if (out := self.export) is not None:  # None before the first merge: only the job was checked
            files = f"{out.files} file(s) re-hashed"
            lines.append(f"PASS: export {out.path} ({out.layout}: {out.rows} rows, {out.bytes} bytes, {files})")
        if self.added_inputs_note:  # an input file added since the plan: the job did not read it
            lines.append(f"note: {self.added_inputs_note}")
        return lines


def verify_job(job_dir: str | Path, expect_nodes: int = 1) -> VerifyResult:
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    cleaned = CleanRecord.read(layout.clean_record)
    for entry in manifest.shards:  # an edited input shard makes every result of it suspect
        if cleaned is not None and manifest.copy_shards:
            break  # the copies were removed with the outputs; the export is checked below
        source = check_shard_file(layout, manifest, entry)
        if source.copy is None:
            for _ in iter_content(source):  # read in place: its content hashed against its scan
                pass
    results = accepted_results(layout, manifest)
    if cleaned is not None:
        return _verify_cleaned(layout, manifest, results, cleaned, expect_nodes)
    by_node: dict[str, int] = {}
    invalid: list[tuple[str, IntegrityError]] = []
    hashed: dict[FileId, tuple[int, int, str]] = {}  # what was just re-hashed, for the export check
    for entry, result in results:
        try:
            output = attempts.validate_result(layout, entry, result)
        except IntegrityError as exc:  # keep going: name every shard to requeue in one go
            invalid.append((entry.shard_id, exc))
            continue
        _remember(hashed, output, (result.rows, result.bytes, result.sha256))
        if result.row_stats is not None:
            record = result.row_stats
            _remember(hashed, layout.resolve_relative(record.path), (result.rows, record.bytes, record.sha256))
        if result.errors is not None:  # validate_result re-hashed the quarantine file too
            errors = result.errors
            _remember(hashed, layout.resolve_relative(errors.path), (errors.rows, errors.bytes, errors.sha256))
        by_node[result.node_id] = by_node.get(result.node_id, 0) + 1
    if invalid:
        shard, first = invalid[0]
        more = f" (and {len(invalid) - 1} more shard(s))" if len(invalid) > 1 else ""
        raise IntegrityError(
            f"{first.message}{more}",
            where=first.where,
            hint=attempts.requeue_hint(layout, [s for s, _ in invalid]),
        )
    nodes = _enough_nodes(layout, by_node, expect_nodes)
    return VerifyResult(
        shards=len(results),
        input_rows=manifest.total_rows,
        output_rows=sum(r.rows for _, r in results),
        nodes=nodes,
        shards_by_node=by_node,
        export=verify_export(layout, manifest, results, hashed),
        added_inputs_note=added_inputs_note(manifest.dataset_path, manifest.inputs),
    )


def _verify_cleaned(layout, manifest: Manifest, results, cleaned: CleanRecord, expect_nodes: int) -> VerifyResult:
    """A cleaned job: the export re-hashed against merge.json, which must be the one the clean verified."""
    merge = MergeRecord.read(layout.merge_record)
    if merge is None or (merge.output_path, merge.layout, merge.sha256) != (
        cleaned.output_path, cleaned.layout, cleaned.merge_sha256
    ):  # fmt: skip
        raise IntegrityError(
            "merge.json is missing or is not the record of the export that was verified before the shard outputs "
            f"were cleaned ({cleaned.output_path})",
            where=str(layout.merge_record),
            hint="the job directory was modified after clean; the export cannot be checked against this job",
        )
    by_node: dict[str, int] = {}
    for _, result in results:
        by_node[result.node_id] = by_node.get(result.node_id, 0) + 1
    return VerifyResult(
        shards=len(results),
        input_rows=manifest.total_rows,
        output_rows=sum(r.rows for _, r in results),
        nodes=_enough_nodes(layout, by_node, expect_nodes),
        shards_by_node=by_node,
        export=verify_export(layout, manifest, results, {}, cleaned=True),
    )


def _enough_nodes(layout: JobLayout, by_node: dict[str, int], expect_nodes: int) -> list[str]:
    nodes = sorted(by_node)
    if len(nodes) < expect_nodes:
        raise JobDirError(
            f"accepted results come from {len(nodes)} node(s) ({', '.join(nodes)}), expected at least {expect_nodes}",
            where=str(layout.root),
            hint="check that every node ran a worker with its own DJ_ELASTIC_NODE_ID or hostname",
        )
    return nodes


def _remember(hashed: dict[FileId, tuple[int, int, str]], path: Path, found: tuple[int, int, str]) -> None:
    """Note a file just re-hashed (by identity: a part that is this very file needs no second read)."""
    try:
        info = os.stat(path)
    except OSError:
        return
    hashed[(info.st_dev, info.st_ino)] = found
