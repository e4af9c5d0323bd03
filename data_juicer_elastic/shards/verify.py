"""Check a finished job without writing anything: every input shard's content hashed again, every shard done
and valid, enough distinct nodes (multi-node runs), and the export merge.json records, in either layout: nothing
missing, nothing extra, nothing stale, every byte re-hashed once (a part that is the accepted file itself, the same
inode, was re-hashed by the result check).  Rules: docs/output-layouts.md.

A cleaned job (``shards.clean``: its shard outputs and shard copies removed) is checked from what is left: the
inputs read in place, every done marker against merge.json, and every byte of the export against the hashes
merge.json recorded (each shard's range against its accepted output's sha256)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from data_juicer_elastic.errors import IntegrityError, JobDirError
from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.exports import PARTS_INDEX, CleanRecord, MergeRecord, PartsIndex
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import check_shard_file, load_manifest
from data_juicer_elastic.jobdir.records import Manifest, ShardEntry, ShardResult
from data_juicer_elastic.rows.jsonl import validate_jsonl_output
from data_juicer_elastic.rows.shard_source import iter_content
from data_juicer_elastic.shards import side_files
from data_juicer_elastic.shards.merge import accepted_results
from data_juicer_elastic.shards.parts import expected_names, name_difference, part_files, read_index_bytes
from data_juicer_elastic.shards.plan import added_inputs_note
from data_juicer_elastic.sharedfs import fsio

FileId = tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True)
class ExportSummary:
    path: Path
    layout: str
    rows: int
    bytes: int
    files: int  # files checked (one, or every part, stats file and the index)


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
    hashed = {} if cleaned is not None else _check_results(layout, results)
    if cleaned is not None:  # the export re-hashed against merge.json, which must be the one the clean verified
        merge = MergeRecord.read(layout.merge_record)
        if merge is None or (merge.output_path, merge.layout, merge.sha256) != (
            cleaned.output_path, cleaned.layout, cleaned.merge_sha256
        ):  # fmt: skip
            raise IntegrityError(
                "merge.json is missing or is not the record of the export that was verified before the shard "
                f"outputs were cleaned ({cleaned.output_path})",
                where=str(layout.merge_record),
                hint="the job directory was modified after clean; the export cannot be checked against this job",
            )
    by_node = dict(Counter(result.node_id for _, result in results))
    return VerifyResult(
        shards=len(results),
        input_rows=manifest.total_rows,
        output_rows=sum(r.rows for _, r in results),
        nodes=_enough_nodes(layout, by_node, expect_nodes),
        shards_by_node=by_node,
        export=verify_export(layout, manifest, results, hashed, cleaned=cleaned is not None),
        added_inputs_note=None if cleaned else added_inputs_note(manifest.dataset_path, manifest.inputs),
    )


def _check_results(layout: JobLayout, results: list[tuple[ShardEntry, ShardResult]]) -> dict[FileId, tuple]:
    """Every accepted result re-checked, naming every invalid one; (rows, bytes, sha256) of each file re-hashed, by
    file identity, for the export check."""
    invalid: list[tuple[str, IntegrityError]] = []
    hashed: dict[FileId, tuple[int, int, str]] = {}
    for entry, result in results:
        try:
            output = attempts.validate_result(layout, entry, result)
        except IntegrityError as exc:  # keep going: name every shard to requeue in one go
            invalid.append((entry.shard_id, exc))
            continue
        _remember(hashed, output, (result.rows, result.bytes, result.sha256))
        for _, relative, expected in side_files.result_files(result):  # validate_result re-hashed them too
            _remember(hashed, layout.resolve_relative(relative), expected)
    if invalid:
        shard, first = invalid[0]
        more = f" (and {len(invalid) - 1} more shard(s))" if len(invalid) > 1 else ""
        raise IntegrityError(
            f"{first.message}{more}",
            where=first.where,
            hint=attempts.requeue_hint(layout, [s for s, _ in invalid]),
        )
    return hashed


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


def verify_export(
    layout: JobLayout,
    manifest: Manifest,
    results: list[tuple[ShardEntry, ShardResult]],
    hashed: dict[FileId, tuple[int, int, str]],
    cleaned: bool = False,
) -> ExportSummary | None:
    """The export merge.json records, checked; None when nothing was merged yet.  ``hashed``: (rows, bytes,
    sha256) of each accepted file the caller re-hashed already, by file identity.  ``cleaned``: the shard
    outputs were removed (``jobdir.exports``), so the export cannot be published again from this job."""
    record = MergeRecord.read(layout.merge_record)
    if record is None:
        return None
    if record.job_id != manifest.job_id:
        raise IntegrityError(
            f"merge.json belongs to another job ({record.job_id}, this job is {manifest.job_id})",
            where=str(layout.merge_record),
            hint="the job directory was modified; merge again",
        )
    export = Path(record.output_path)
    hint = f"publish it again: `dj-elastic merge --job-dir {layout.root} --output {export} --overwrite`"
    if cleaned:
        hint = (
            "the shard outputs were cleaned, so this job cannot publish it again: restore the export from a "
            "copy, or run the recipe with a new job_dir"
        )
    if record.layout == "parts":
        return _verify_parts(export, record, manifest, results, hashed, hint)
    return _verify_file(export, record, results, hint)


def _verify_file(
    export: Path, record: MergeRecord, results: list[tuple[ShardEntry, ShardResult]], hint: str
) -> ExportSummary:
    where = str(export)
    if not os.path.isfile(export) or os.path.islink(export):
        raise IntegrityError("the export merge.json records is missing (or not a file)", where=where, hint=hint)
    if [(m.shard_id, m.attempt_id, m.sha256) for m in record.shards] != [
        (entry.shard_id, result.attempt_id, result.sha256) for entry, result in results
    ]:
        raise IntegrityError("the export is stale: shards were run again since it was merged", where=where, hint=hint)
    whole, size = hashlib.sha256(), 0
    with fsio.open_read(export) as handle:
        for shard in record.shards:
            part, left = hashlib.sha256(), shard.bytes
            while left > 0:
                block = handle.read(min(left, 1 << 20))
                if not block:
                    break
                part.update(block)
                whole.update(block)
                left -= len(block)
                size += len(block)
            if part.hexdigest() != shard.sha256:
                raise IntegrityError(
                    f"the bytes of shard {shard.shard_id} in the export do not match its accepted output",
                    where=where,
                    hint=hint,
                )
        extra = handle.read(1)
    if extra or size != record.bytes or whole.hexdigest() != record.sha256:
        raise IntegrityError(f"the export does not match merge.json (sha256 {record.sha256})", where=where, hint=hint)
    files = 1
    for what, path, sha256 in side_files.beside_export(record):
        found = fsio.file_sha256(Path(path)) if os.path.isfile(path) else None
        if found is None or found[1] != sha256:
            now = "it is gone" if found is None else f"it hashes to {found[1]} now"
            raise IntegrityError(
                f"the export's {what} is missing or changed since the merge: merge.json records sha256 {sha256}, {now}",
                where=path,
                hint=hint,
            )
        files += 1
    return ExportSummary(export, "file", sum(m.rows for m in record.shards), size, files)


def _verify_parts(
    export: Path,
    record: MergeRecord,
    manifest: Manifest,
    results: list[tuple[ShardEntry, ShardResult]],
    hashed: dict[FileId, tuple[int, int, str]],
    hint: str,
) -> ExportSummary:
    where = str(export)
    if not export.is_dir() or export.is_symlink():
        raise IntegrityError(
            "the parts export merge.json records is missing (or not a directory)", where=where, hint=hint
        )
    index_path = str(export / PARTS_INDEX)
    try:
        data = read_index_bytes(export)
        if data is None:
            raise IntegrityError(f"{PARTS_INDEX} is missing: the export is not complete", where=where, hint=hint)
        index = PartsIndex.parse(data, export / PARTS_INDEX)
    except JobDirError as exc:
        raise IntegrityError(f"torn or foreign index: {exc.message}", where=index_path, hint=hint) from None
    if hashlib.sha256(data).hexdigest() != record.sha256 or index.job_id != manifest.job_id:
        raise IntegrityError("the index is not the one merge.json records", where=index_path, hint=hint)
    if len(index.parts) != len(results):
        raise IntegrityError(
            f"the index names {len(index.parts)} parts for {len(results)} shards", where=where, hint=hint
        )
    for part, (entry, result) in zip(index.parts, results, strict=True):
        if (part.shard_id, part.attempt_id, part.rows, part.bytes, part.sha256) != (
            entry.shard_id, result.attempt_id, result.rows, result.bytes, result.sha256
        ):  # fmt: skip
            raise IntegrityError(
                f"{part.name} is not shard {entry.shard_id}'s accepted output (the shard ran again since, or the "
                "index was edited)",
                where=where,
                hint=hint,
            )
    missing, extra = name_difference(set(os.listdir(export)), index.parts)
    if missing:
        raise IntegrityError(f"{missing[0]} is missing from the export", where=where, hint=hint)
    if extra:
        raise IntegrityError(f"{extra[0]} is in the export but not in its index", where=where, hint=hint)
    for name, expected in (file for part in index.parts for file in part_files(part)):
        _check_part(export / name, expected, hashed, hint)
    if (index.rows, index.bytes) != (sum(p.rows for p in index.parts), sum(p.bytes for p in index.parts)):
        raise IntegrityError("the index's totals do not add up", where=index_path, hint=hint)
    return ExportSummary(export, "parts", index.rows, index.bytes, len(expected_names(index.parts)))


def _check_part(path: Path, expected: tuple[int, int, str], hashed: dict[FileId, tuple[int, int, str]], hint: str):
    found = os.lstat(path)
    if not stat.S_ISREG(found.st_mode):
        raise IntegrityError(f"{path.name} is not a regular file", where=str(path.parent), hint=hint)
    known = hashed.get((found.st_dev, found.st_ino))
    if known is None:
        try:
            known = tuple(validate_jsonl_output(path, str(path)))
        except ValueError as exc:
            raise IntegrityError(f"{path.name} is corrupt: {exc}", where=str(path.parent), hint=hint) from None
    if tuple(known) != tuple(expected):
        rows, size, sha = expected
        raise IntegrityError(
            f"{path.name} does not match the index: expected rows={rows} bytes={size} sha256={sha}, found "
            f"rows={known[0]} bytes={known[1]} sha256={known[2]}",
            where=str(path.parent),
            hint=hint,
        )
