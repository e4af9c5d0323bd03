"""A shard runner without Ray: the real reader and writer with nothing in between.

What ``execution.ShardRunner`` does around RayExecutor (read the shard with the job's row
schema, write the result with ``row_writer``), for tests of everything around a shard run
(worker loop, publication, merge, stats) that need real outputs but not operators.  Rows
that hold ``__dj__stats__`` look like a Filter's output: it goes to the row stats file.
"""

from __future__ import annotations

from pathlib import Path

from data_juicer_elastic.execution.row_writer import ExportLayout, write_shard
from data_juicer_elastic.execution.shard_reader import ArrowRows, InputRows, read_tables
from data_juicer_elastic.jobdir.attempts import ShardOutput, ShardTask
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.stats.shard_summary import ShardStatsRecorder


def rayfree_runner(job_dir: Path, layout: ExportLayout = ExportLayout()):
    rows = ArrowRows.from_manifest(load_manifest(job_dir).row_schema, where="test")

    def run(task: ShardTask) -> ShardOutput:
        tables = read_tables(task.source, rows)
        recorder = ShardStatsRecorder(task.shard_id, task.attempt_id, task.attempt_dir)
        inputs = InputRows(task.source)
        try:
            written = write_shard(
                tables,
                tables[0].column_names,
                inputs,
                task.attempt_dir / "output.jsonl",
                task.attempt_dir / "row-stats.jsonl",
                layout,
                on_row=recorder.observe,
            )
        finally:
            inputs.close()
        out = written.output
        return ShardOutput(
            out.path,
            out.rows,
            out.bytes,
            out.sha256,
            stats_path=recorder.write(out.rows, out.sha256),
            row_stats_path=None if written.row_stats is None else written.row_stats.path,
        )

    return run
