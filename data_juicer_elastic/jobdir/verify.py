"""Check a finished job without writing anything: every shard done and valid, and
(for multi-node runs) that enough distinct nodes contributed accepted results."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import attempts
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.merge import accepted_results
from data_juicer_elastic.jobdir.row_stats import copy_row_stats


@dataclass(frozen=True)
class VerifyResult:
    shards: int
    input_rows: int
    output_rows: int
    nodes: list[str]  # distinct node ids of the accepted results, sorted
    shards_by_node: dict[str, int]


def verify_job(job_dir: str | Path, expect_nodes: int = 1) -> VerifyResult:
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = load_manifest(layout.root)
    results = accepted_results(layout, manifest)
    by_node: dict[str, int] = {}
    for entry, result in results:
        attempts.validate_result(layout, entry, result)
        copy_row_stats(layout, entry, result, lambda block: None)  # its per-row stats file too
        by_node[result.node_id] = by_node.get(result.node_id, 0) + 1
    nodes = sorted(by_node)
    if len(nodes) < expect_nodes:
        raise JobDirError(
            f"accepted results come from {len(nodes)} node(s) ({', '.join(nodes)}), expected at least {expect_nodes}",
            where=str(layout.root),
            hint="check that every node ran a worker with its own DJ_ELASTIC_NODE_ID or hostname",
        )
    return VerifyResult(
        shards=len(results),
        input_rows=manifest.total_rows,
        output_rows=sum(r.rows for _, r in results),
        nodes=nodes,
        shards_by_node=by_node,
    )
