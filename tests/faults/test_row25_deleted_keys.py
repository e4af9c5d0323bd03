"""Fault matrix row 25: an operator that deletes a nested key from some rows, or adds a key to some
rows only, gives the same merged bytes for any ``num_shards``.

Arrow fills a key some rows of a batch lack with null, and a key no row of a batch has is no
column there; which rows share a batch follows the shard boundaries.  The writer treats null
and absent as one (``execution.row_writer.restore_fields``): a key the input row had is written
(null once deleted), a null under a key it lacked is not.  Through ``dj-process`` with one row
per shard (where Arrow drops the deleted key) and with one shard (where it fills it with null).
The same rule over generated operators and batchings: ``tests/execution/test_lossless.py``;
through the executor with Ray: ``tests/execution/test_shard_invariance.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_juicer_elastic.execution.row_writer import encode_row

from .commands import dj_process, recipe

pytestmark = [pytest.mark.ray, pytest.mark.e2e]

TEST_OPS = Path(__file__).resolve().parents[1] / "execution" / "dj_elastic_test_ops"
ROWS = 6
# meta.src deleted from every odd row; a top-level tag added to every even row only
EDITS = [["meta.src", "delete", None, 2, 1], ["tag", "set", "t", 2, 0]]


def _expected() -> bytes:
    rows = []
    for i in range(ROWS):
        row = {"id": i, "text": f"row {i}", "meta": {"src": f"s{i}" if i % 2 == 0 else None, "n": "x"}}
        if i % 2 == 0:
            row["tag"] = "t"
        rows.append(encode_row(row))
    return b"".join(rows)


@pytest.mark.parametrize("num_shards", [ROWS, pytest.param(1, marks=pytest.mark.extended)])
def test_deleted_and_partly_added_keys_give_the_same_bytes_for_any_num_shards(tmp_path, num_shards):
    data = tmp_path / "input.jsonl"
    rows = [{"id": i, "text": f"row {i}", "meta": {"src": f"s{i}", "n": "x"}} for i in range(ROWS)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    export = tmp_path / "out" / "merged.jsonl"
    path = recipe(
        tmp_path, data, tmp_path / "job", export=export, elastic={"num_shards": num_shards},
        process=[{"dj_elastic_test_reshape_mapper": {"edits": json.dumps(EDITS)}}],
        custom_operator_paths=[str(TEST_OPS)],
    )  # fmt: skip
    proc = dj_process(path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert export.read_bytes() == _expected()
