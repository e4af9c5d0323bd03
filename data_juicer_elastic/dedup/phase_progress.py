"""Where a job's deduplication stands, read from its job directory for ``dj-elastic status``: per stage,
the phase it is in and how many of that phase's tasks have published (a listing of the phase's folder,
the plan's group count), or, once decided, the rows that reached it and the rows it dropped (its
``cluster.json``).  A display: nothing is checked here (the workers check every file they use).
:func:`removed_rows`: each deduplicator's count for ``merge.json`` and the closing summary (checked).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from data_juicer_elastic.dedup.phase_records import CLUSTER_KIND, read_phase_record
from data_juicer_elastic.dedup.stages import DedupStage, dedup_stages, stage_identity
from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import Manifest
from data_juicer_elastic.sharedfs import fsio


@dataclass(frozen=True)
class StageProgress:
    stage: int
    stages: int
    op: str  # the deduplicator as the recipe names it
    position: int  # process[position]
    phase: str  # signatures, buckets, cluster, or done
    done: int  # tasks of the phase published (done: 1)
    total: int | None  # tasks of the phase (None: the bucket plan is not published yet)
    rows: int | None = None  # rows that reached the deduplicator, once decided
    dropped: int | None = None  # rows it dropped as copies, once decided
    failed: int | None = None  # rows whose hashing raised (quarantined, dropped too), once decided

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def text(self) -> str:
        """``dedup 1/2 document_minhash_deduplicator: buckets 12/32``."""
        head = f"dedup {self.stage}/{self.stages} {self.op}"
        if self.phase == "done":
            quarantined = f", {self.failed} quarantined (their hashing failed)" if self.failed else ""
            return f"{head}: done, {self.dropped} of {self.rows} rows dropped{quarantined}"
        return f"{head}: {self.phase} {self.done}/{'?' if self.total is None else self.total}"


def _json(path) -> dict[str, Any] | None:
    try:
        data = fsio.read_record(path)
        return json.loads(data) if data is not None else None
    except (OSError, ValueError):
        return None


def _count(directory, suffix: str) -> int:
    return sum(1 for name in fsio.list_names(directory) if name.endswith(suffix) and not name.startswith("."))


def dedup_progress(layout: JobLayout, recipe: dict[str, Any], num_shards: int) -> list[StageProgress]:
    """Every deduplicator of ``recipe`` (the job's), its phase and counts; [] when it has none."""
    stages = dedup_stages(recipe.get("process") or [])
    return [stage_progress(layout, stage, len(stages), num_shards) for stage in stages]


def stage_progress(layout: JobLayout, stage: DedupStage, stages: int, num_shards: int) -> StageProgress:
    """One deduplicator's phase and counts: its marker, else its bucket plan, then one listing (the
    signatures while no plan exists, once it does the edge files: the plan is published only once
    every shard's signatures are)."""
    n, base = stage.number, layout.dedup_stage(stage.number)
    row = {"stage": n, "stages": stages, "op": stage.op_name, "position": stage.position}
    marker = _json(layout.dedup_cluster(n))
    if marker is not None:
        return StageProgress(**row, phase="done", done=1, total=1, rows=marker.get("rows"),
                             dropped=marker.get("dropped"), failed=marker.get("failed", 0))  # fmt: skip
    plan = _json(layout.dedup_bucket_plan(n))
    if plan is None:
        return StageProgress(**row, phase="signatures", done=_count(base / "signatures", ".sig"), total=num_shards)
    groups, edges = len(plan.get("groups") or []), _count(base / "edges", ".edges")
    if edges < groups:
        return StageProgress(**row, phase="buckets", done=edges, total=groups)
    return StageProgress(**row, phase="cluster", done=0, total=1)


def removed_rows(layout: JobLayout, manifest: Manifest) -> list[dict[str, Any]]:
    """The rows each deduplicator of the job removed, from its stage's checked ``cluster.json`` (for
    ``merge.json`` and the closing summary): stage, op, process position, rows that reached it, rows
    dropped as copies, rows whose hashing failed (quarantined).  A stage without a valid marker is left out."""
    found = []
    for stage in dedup_stages(manifest.recipe.get("process") or []):
        identity = stage_identity(manifest.recipe_hash, stage)
        try:
            marker = read_phase_record(layout.dedup_cluster(stage.number), CLUSTER_KIND, identity)
        except IntegrityError:
            marker = None
        if marker is not None:
            found.append({"stage": stage.number, "op": stage.op_name, "position": stage.position,
                          "rows": marker["rows"], "dropped": marker["dropped"],
                          "failed": marker.get("failed", 0)})  # fmt: skip
    return found
