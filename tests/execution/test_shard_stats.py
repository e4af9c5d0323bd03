"""The shard runner keeps every row's stats (in the row stats file, Data-Juicer's layout) and
writes the shard's stats summary (real Ray)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from data_juicer_elastic.execution.shard_runner import ShardRunner
from data_juicer_elastic.execution.stage_identities import compute_stage_identities
from data_juicer_elastic.stats.columns import ColumnKind
from data_juicer_elastic.stats.shard_summary import StatsSummary

from .conftest import read_jsonl, recipe, schema_of
from .test_shard_runner import make_task

pytestmark = pytest.mark.ray
STATS = "__dj__stats__"


def test_input_stats_survive_and_the_summary_describes_the_output(ray_runtime, cache_dir, tmp_path):
    """Regression: RayExecutor drops an *input* __dj__stats__ column unless keep_stats_in_res_ds is set,
    so re-processing a merged output (which carries stats) used to lose every row's stats."""
    shard = tmp_path / "shards" / "s.jsonl"
    shard.parent.mkdir(parents=True)
    rows = [{"text": f"row {i} " + "y" * (i % 30), STATS: {"old_score": i / 10}} for i in range(60)]
    shard.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    rec = recipe()
    output = ShardRunner(rec, compute_stage_identities(rec), cache_dir, row_schema=schema_of(shard))(
        make_task(tmp_path, shard, "part-00000-of-00001")
    )

    out_rows = read_jsonl(output.row_stats_path)
    assert 0 < len(out_rows) == output.rows < len(rows)
    assert all({"old_score", "text_len"} <= set(row[STATS]) for row in out_rows)
    assert all(STATS not in row for row in read_jsonl(output.output_path)), "keep_stats_in_res_ds is off"

    summary = StatsSummary.parse(output.stats_path.read_bytes(), output.stats_path)
    assert (summary.rows, summary.output_sha256) == (output.rows, output.sha256)
    frame = pd.DataFrame([row[STATS] for row in out_rows])
    columns = {c.name: c for c in summary.columns}
    assert set(columns) == set(frame.columns)
    for name, column in columns.items():
        assert column.kind is ColumnKind.NUMERIC
        want = frame[name].describe()
        assert (column.moments.count, column.moments.min, column.moments.max) == (
            want["count"],
            want["min"],
            want["max"],
        )
        assert column.moments.std == pytest.approx(want["std"], rel=1e-12)
