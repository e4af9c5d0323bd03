"""The scan phase of a job as status, the live line and the report show it: how far the scans are
(one listing each of ``scans/done``, ``scans/claims`` and ``scans/failed``, then the scan records
that exist, with a few threads), how fast they read (bytes over the time from the first scan's
start to the last one's end), and whether one refused the input."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_juicer_elastic.jobdir.attempts import read_done
from data_juicer_elastic.jobdir.layout import JobLayout, is_shard_id
from data_juicer_elastic.jobdir.records import JobPlan, Manifest, ScanResult
from data_juicer_elastic.sharedfs import fsio


@dataclass(frozen=True)
class ScanPhase:
    shards: int
    scanned: int  # scan records published
    running: int  # shards whose scan is claimed and not published
    failed: int  # scans whose budget is spent
    refused: int  # scans that refused their input
    bytes_total: int  # planned (stored) bytes of every shard
    bytes_scanned: int  # content bytes of the published scans
    started_at: float | None  # the first scan's start
    finished_at: float | None  # the last published scan's end
    planned_at: float  # the plan's creation: when the job was submitted
    bytes_read_to_plan: int  # what the planner read to place the cuts (serial)
    compressed_files: int  # compressed inputs: each one serial unit (never cut)
    largest_unit_bytes: int  # the largest compressed input (the longest serial unit)

    @property
    def complete(self) -> bool:
        return self.scanned == self.shards

    @property
    def secs(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return max(self.finished_at - self.started_at, 1e-3)

    @property
    def bytes_per_sec(self) -> float | None:
        secs = self.secs
        return None if secs is None or not self.bytes_scanned else self.bytes_scanned / secs

    def to_json(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "scanned": self.scanned,
            "running": self.running,
            "failed": self.failed,
            "refused": self.refused,
            "bytes_total": self.bytes_total,
            "bytes_scanned": self.bytes_scanned,
            "secs": self.secs,
            "bytes_per_sec": self.bytes_per_sec,
            "planned_at": self.planned_at,
            "bytes_read_to_plan": self.bytes_read_to_plan,
            "compressed_files": self.compressed_files,
            "largest_unit_bytes": self.largest_unit_bytes,
        }


def read_scan_phase(layout: JobLayout, plan: JobPlan) -> ScanPhase:
    """How far the scans of ``plan`` are (reads only)."""
    scans = layout.scans
    ids = set(plan.shard_ids)
    done = sorted(shard_names(scans.done_dir, ".json") & ids)
    claimed = shard_names(scans.claims_dir, "") & ids
    failed = shard_names(scans.failed_dir, ".json") & ids
    results = [r for r in fsio.read_many(lambda shard: read_done(scans, shard)[0], done) if r]
    results = [r for r in results if isinstance(r, ScanResult)]
    compressed = [i.size for i in plan.inputs if i.codec != "none"]
    return ScanPhase(
        shards=plan.num_shards,
        scanned=len(results),
        running=len(claimed - set(done) - failed),
        failed=len(failed),
        refused=sum(1 for r in results if r.refusal is not None),
        bytes_total=plan.total_bytes,
        bytes_scanned=sum(r.bytes for r in results),
        started_at=min((r.started_at for r in results), default=None),
        finished_at=max((r.finished_at for r in results), default=None),
        planned_at=plan.created_at,
        bytes_read_to_plan=plan.planned_bytes_read,
        compressed_files=len(compressed),
        largest_unit_bytes=max(compressed, default=0),
    )


def scanned_phase(manifest: Manifest) -> ScanPhase | None:
    """The scan phase of a scanned job, from its manifest alone (None for a job prepared whole)."""
    summary = manifest.scan
    if summary is None:
        return None
    compressed = [i.size for i in manifest.inputs if i.codec != "none"]
    return ScanPhase(
        shards=manifest.num_shards,
        scanned=manifest.num_shards,
        running=0,
        failed=0,
        refused=0,
        bytes_total=sum(e.span_bytes for e in manifest.shards),
        bytes_scanned=manifest.total_bytes,
        started_at=summary.started_at,
        finished_at=summary.finished_at,
        planned_at=summary.planned_at,
        bytes_read_to_plan=summary.bytes_read_to_plan,
        compressed_files=len(compressed),
        largest_unit_bytes=max(compressed, default=0),
    )


def shard_names(directory: Path, suffix: str, known: Set[str] = frozenset()) -> set[str]:
    """Shard ids named in a directory listing (``<shard><suffix>``); anything else is ignored.
    ``known``: ids known to be well formed (the manifest's), taken without a check (a set
    intersection: the 75,000 names of a big job's ``done/`` in a few milliseconds)."""
    cut = len(suffix)
    names = {name[: len(name) - cut] for name in fsio.list_names(directory) if name.endswith(suffix)}
    found = names & known
    return found.union(shard for shard in names - found if is_shard_id(shard))


def scan_text(phase: ScanPhase) -> str:
    """One line about the scan phase (status, the report)."""
    rate = phase.bytes_per_sec
    speed = f", {rate / 1e6:,.1f} MB/s" if rate else ""
    text = f"scan: {phase.scanned}/{phase.shards} shards scanned ({phase.bytes_scanned / 1e6:,.1f} MB{speed})"
    if phase.running:
        text += f", {phase.running} scanning"
    if phase.refused:
        text += f", {phase.refused} refused the input"
    if phase.failed:
        text += f", {phase.failed} failed"
    if phase.compressed_files:
        text += (
            f"; {phase.compressed_files} compressed file(s) are read whole, each by one scan "
            f"(largest {phase.largest_unit_bytes / 1e6:,.1f} MB)"
        )
    return text
