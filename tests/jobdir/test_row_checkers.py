"""A scan's row checks in helper processes (rows.row_checkers): the same shards, rows and
errors as the serial path, and a dead helper costs speed, never correctness.

The inputs span several 8 MiB read blocks, so lines cross block boundaries, and the
helper path is forced on (``ShardScanner(processes=...)``) at sizes where the
default would stay serial."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from concurrent.futures import Future
from pathlib import Path

import pytest

from data_juicer_elastic.errors import InputError
from data_juicer_elastic.rows.jsonl import NormaliseOptions
from data_juicer_elastic.rows.row_checkers import RowCheckers
from data_juicer_elastic.rows.row_schema import RowSchema
from data_juicer_elastic.shards.prepare import plan_job

from .conftest import request, scan_locally

ROWS = 21_000  # ~1 KB each: ~21 MB, three read blocks


def _row(i: int) -> bytes:
    row = {"id": i, "text": f"row {i} " + "lorem ipsum " * (80 + i % 9), "meta": {"n": i, "url": "https://x/y"}}
    return json.dumps(row).encode()


def _write(path: Path, lines: list[bytes], newline: bytes = b"\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(newline.join(lines) + newline)
    return path


def _prepare(tmp_path: Path, data: Path, processes: int, name: str, **kw):
    plan_job(request(tmp_path / name, data, 5, **kw))
    return scan_locally(tmp_path / name, processes)


def _prepared(tmp_path: Path, data: Path, processes: int, name: str, **kw) -> dict:
    manifest = _prepare(tmp_path, data, processes, name, **kw)
    shards = [(s.rows, s.bytes, s.sha256, s.first_row) for s in manifest.shards]
    return {
        "shards": shards,
        "content": manifest.content_sha256,
        "rows": manifest.total_rows,
        "schema": manifest.row_schema,
    }


def _recording_checks(monkeypatch) -> list[Future]:
    """Every verdict the helpers give (so a test can tell they were asked, and said "clean")."""
    futures: list[Future] = []
    check = RowCheckers.check

    def recorded(self, *args):
        futures.append(check(self, *args))
        return futures[-1]

    monkeypatch.setattr(RowCheckers, "check", recorded)
    return futures


def test_a_scan_in_helper_processes_matches_the_serial_path(tmp_path, monkeypatch):
    verdicts = _recording_checks(monkeypatch)
    lines = [_row(i) for i in range(ROWS)]
    lines[7] = json.dumps({"id": 7, "text": "relative", "images": ["a/b.png"]}).encode()  # normalised
    lines[9_000] = b"  " + lines[9_000] + b"\r"  # stripped
    lines[15_000] = json.dumps({"id": 1, "x": 10**30}).encode()  # big integer: the reference decides
    lines[16_000] = json.dumps({"id": 2, "meta": {"n": 1.5, "extra": [1]}}).encode()  # types from one row
    data = _write(tmp_path / "in.jsonl", lines)
    serial = _prepared(tmp_path, data, 0, "serial")
    helpers = _prepared(tmp_path, data, 2, "helpers")
    assert helpers == serial, "same shards and the same row schema from helpers and the serial path"
    assert serial["rows"] == ROWS
    assert serial["schema"][-1] == ["x", "float"] and serial["schema"][2][1]["struct"][0] == ["n", "float"]
    clean = [f.result() for f in verdicts if f.result()[1]]
    assert len(clean) >= 2 and len(clean) < len(verdicts), "the helpers judged blocks both ways"
    with_index = _prepared(tmp_path, data, 2, "helpers-index", index_key="row_index")
    assert with_index == _prepared(tmp_path, data, 0, "serial-index", index_key="row_index")


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
        (b'{"x": 1e400}', "overflows"),
        (b"[1, 2]", "JSON object"),
        (b"", "blank line"),
    ],
)
@pytest.mark.parametrize("at", [3, 9_500, ROWS - 1])
def test_a_bad_row_is_reported_at_its_line_by_either_path(tmp_path, bad, fragment, at):
    lines = [_row(i) for i in range(ROWS)]
    lines[at] = bad
    data = _write(tmp_path / "in.jsonl", lines)
    for processes in (0, 2):
        with pytest.raises(InputError) as info:
            _prepare(tmp_path, data, processes, f"job{processes}")
        assert info.value.where == f"{data}:{at + 1}" and fragment in info.value.message
        assert not (tmp_path / f"job{processes}" / "manifest.json").exists()


@pytest.mark.parametrize("at", [0, 10_000, ROWS - 1])
def test_a_too_long_line_is_reported_at_its_line_by_either_path(tmp_path, at):
    lines = [_row(i) for i in range(ROWS)]
    lines[at] = json.dumps({"id": at, "text": "y" * 5_000}).encode()
    data = _write(tmp_path / "in.jsonl", lines)
    for processes in (0, 2):
        with pytest.raises(InputError) as info:
            _prepare(tmp_path, data, processes, f"job{processes}", max_line_bytes=4_000)
        assert info.value.where == f"{data}:{at + 1}" and "longer than 4000" in info.value.message


def test_compressed_input_is_checked_from_the_bytes_sent(tmp_path):
    import gzip

    lines = [_row(i) for i in range(ROWS)]
    plain = _write(tmp_path / "in.jsonl", lines)
    packed = tmp_path / "gz" / "in.jsonl.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=1))
    assert _prepared(tmp_path, packed, 2, "helpers") == _prepared(tmp_path, packed, 0, "serial")


def test_a_dead_helper_fails_its_checks_and_the_scan_falls_back(tmp_path, monkeypatch):
    options = NormaliseOptions(str(tmp_path), {}, None)
    block = b"\n".join(_row(i) for i in range(3)) + b"\n"
    with contextlib.closing(RowCheckers(1, options)) as checkers:
        rows, clean, schema = checkers.check(None, 0, len(block), block).result(timeout=60)
        expected = RowSchema()
        expected.observe_all([json.loads(line) for line in block.splitlines()])
        assert (rows, clean, schema) == (3, True, expected), "a clean block comes back with its row schema"
        assert checkers.check(None, 0, 6, b"[1]\n{\n").result(timeout=60) == (2, False, None)
        os.kill(checkers._children[0].pid, signal.SIGKILL)
        with pytest.raises((EOFError, BrokenPipeError)):
            checkers.check(None, 0, len(block), block).result(timeout=60)
        later = checkers.check(None, 0, len(block), block)
        assert later.done(), "with no helper left a check fails at once, it never waits"
        with pytest.raises((EOFError, BrokenPipeError)):
            later.result()

    def failed(self, *args):
        future: Future = Future()
        future.set_exception(EOFError("row checker process ended"))
        return future

    data = _write(tmp_path / "in.jsonl", [_row(i) for i in range(ROWS)])
    monkeypatch.setattr(RowCheckers, "check", failed)
    assert _prepared(tmp_path, data, 2, "fallback") == _prepared(tmp_path, data, 0, "serial")


def test_no_helper_can_start_and_the_scan_checks_every_row_itself(tmp_path, monkeypatch):
    from data_juicer_elastic.rows import row_checkers

    def no_process(*args, **kwargs):
        raise OSError(11, "Resource temporarily unavailable")

    data = _write(tmp_path / "in.jsonl", [_row(i) for i in range(ROWS)])
    serial = _prepared(tmp_path, data, 0, "serial")
    monkeypatch.setattr(row_checkers.subprocess, "Popen", no_process)
    with contextlib.closing(RowCheckers(2, NormaliseOptions(str(tmp_path), {}, None))) as checkers:
        assert checkers.check(None, 0, 3, b"{}\n").done(), "fails at once, never waits"
    assert _prepared(tmp_path, data, 2, "no-helpers") == serial
