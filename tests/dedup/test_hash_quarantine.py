"""Rows whose hashing raised among a shard's own quarantined rows: one stream in input order, each line as
written, however the shard's checked file arrives in chunks (``shards.side_files._shard_errors``).  The
whole path (signature run, cluster, merge, a tampered file refused) is fault matrix row 37's."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.shards import side_files


def _line(row: int, op: str) -> bytes:
    return json.dumps({"shard_row": row, "op": op, "row": {"id": row}}, separators=(",", ":")).encode() + b"\n"


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.integers(min_value=0, max_value=200), unique=True, max_size=30),
    split=st.data(),
)
def test_failed_rows_go_among_the_shards_own_lines_in_input_order(rows, split):
    cut = split.draw(st.integers(min_value=0, max_value=len(rows)))
    own, failed = sorted(rows[:cut]), sorted(rows[cut:])
    data = b"".join(_line(r, "my_mapper") for r in own)
    chunk = split.draw(st.integers(min_value=1, max_value=64))

    def checked_copy(layout, entry, result, requeue, sink):  # the checked file, in chunks of any size
        for at in range(0, len(data), chunk):
            sink(data[at : at + chunk])
        return len(own)

    original, side_files.check_row_errors_file = side_files.check_row_errors_file, checked_copy
    try:
        out: list[bytes] = []
        failures = [(r, _line(r, "elastic_dedup_hash")) for r in failed]
        count = side_files._shard_errors(None, None, _WithErrors() if own else _NoErrors(), "", failures, out.append)
    finally:
        side_files.check_row_errors_file = original
    lines = b"".join(out).splitlines()
    assert count == len(rows) == len(lines)
    assert [json.loads(line)["shard_row"] for line in lines] == sorted(rows)
    assert {json.loads(line)["shard_row"] for line in lines if b"elastic_dedup_hash" in line} == set(failed)


class _NoErrors:
    errors = None


class _WithErrors:
    errors = "recorded"
