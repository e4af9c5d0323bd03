"""Fault matrix row 12: malformed JSONL.  One stated policy per case (docs/input-format.md),
the same whichever parser judges the line, errors naming file:line, memory bounded."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import InputError
from data_juicer_elastic.rows import codecs
from data_juicer_elastic.rows.jsonl import NormaliseOptions, RowNormaliser
from data_juicer_elastic.rows.row_policy import MAX_DEPTH, FastJudge, reference_row
from data_juicer_elastic.shards.prepare import prepare_job

from .conftest import request, shard_lines

GOOD = b'{"id": 0, "text": "hello"}'


def _nest(depth: int) -> bytes:
    return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


# line -> (accepted?, message fragment when refused).  The table in docs/input-format.md.
POLICY = {
    "plain object": (GOOD, True, ""),
    "array row": (b"[1, 2]", False, "JSON object"),
    "scalar row": (b"42", False, "JSON object"),
    "string row": (b'"text"', False, "JSON object"),
    "NaN": (b'{"x": NaN}', False, "NaN"),
    "Infinity": (b'{"x": -Infinity}', False, "Infinity"),
    "double overflow": (b'{"x": 1e400}', False, "overflows"),
    # jiter reads these as inf; simdjson's refusal is what keeps them off the fast path.
    "double overflow, two-digit exponent": (b'{"x": ' + b"1" * 250 + b"e60}", False, "overflows"),
    "double overflow, long mantissa": (b'{"x": ' + b"9" * 310 + b".5}", False, "overflows"),
    "largest double": (b'{"x": 1.7976931348623157e308}', True, ""),
    "underflow to zero": (b'{"x": -1e-400}', True, ""),
    "400-digit integer": (b'{"x": ' + b"7" * 400 + b"}", True, ""),
    "5000-digit integer": (b'{"x": ' + b"7" * 5000 + b"}", False, "4300"),
    "duplicate top-level key": (b'{"a": 1, "a": 2}', False, "duplicate key 'a'"),
    "duplicate nested key": (b'{"m": {"k": 1, "k": 1}, "t": "x:y"}', False, "duplicate key 'k'"),
    "duplicate key hidden by an escaped colon": (b'{"a\\u003a": 1, "b": 2, "b": 3}', False, "duplicate key 'b'"),
    "escaped colon, no duplicate": (b'{"a\\u003a": 1, "b": "c:d"}', True, ""),
    "colons in strings": (b'{"url": "https://x/y", "t": "a: b: c"}', True, ""),
    "escaped quote before colon": (b'{"t": "say \\": here"}', True, ""),
    "lone high surrogate": (b'{"t": "\\ud800"}', False, "surrogate"),
    "lone low surrogate": (b'{"t": "\\udc00x"}', False, "surrogate"),
    "surrogate pair": (b'{"t": "\\ud83d\\ude00"}', True, ""),
    "raw UTF-8 surrogate bytes": (b'{"t": "\xed\xa0\x80"}', False, "UTF-8"),
    "invalid UTF-8": (b'{"t": "\xff"}', False, "UTF-8"),
    "overlong UTF-8": (b'{"t": "\xc0\xaf"}', False, "UTF-8"),
    "raw NUL in a string": (b'{"t": "a\x00b"}', False, "invalid JSON"),
    "raw NUL outside strings": (b'{"t": 1}\x00', False, "invalid JSON"),
    "escaped NUL": (b'{"t": "a\\u0000b"}', True, ""),
    "raw tab in a string": (b'{"t": "a\tb"}', False, "invalid JSON"),
    f"depth {MAX_DEPTH}": (_nest(MAX_DEPTH), True, ""),
    f"depth {MAX_DEPTH + 1}": (_nest(MAX_DEPTH + 1), False, "nested too deeply"),
    "depth 100000": (_nest(100_000), False, "nested too deeply"),
    "trailing garbage": (GOOD + b" x", False, "invalid JSON"),
    "two objects on a line": (GOOD + b"," + GOOD, False, "invalid JSON"),
    "BOM inside the file": (b"\xef\xbb\xbf" + GOOD, False, "invalid JSON"),
}


def _verdict(judge, line: bytes) -> tuple[bool, object]:
    try:
        return True, judge(line)
    except ValueError as exc:
        return False, str(exc)


@pytest.mark.parametrize("case", sorted(POLICY))
def test_both_parsers_follow_one_policy(case):
    line, accepted, fragment = POLICY[case]
    ok, value = _verdict(reference_row, line)
    assert ok is accepted, f"reference: {value}"
    if not ok:
        assert fragment in value
    fast = FastJudge().row(line)
    # orjson may only *prove* acceptance; anything it cannot prove goes to the reference.
    assert fast is None or accepted, "the accelerator accepted a line the policy refuses"
    if fast is not None:
        assert json.dumps(fast, sort_keys=True) == json.dumps(json.loads(line), sort_keys=True) or case.startswith(
            "400"
        )


@pytest.mark.parametrize("case", sorted(POLICY))
def test_prepare_applies_the_policy_with_file_and_line(tmp_path, case):
    line, accepted, fragment = POLICY[case]
    data = tmp_path / "in.jsonl"
    # The case sits among good rows in one block, so the block-level proofs are exercised too.
    data.write_bytes(b"\n".join([GOOD] * 5 + [line] + [GOOD] * 5) + b"\n")
    if accepted:
        prepare_job(request(tmp_path / "job", data, 2))
        assert shard_lines(tmp_path / "job")[5] == line, "accepted rows keep their bytes"
        return
    with pytest.raises(InputError) as info:
        prepare_job(request(tmp_path / "job", data, 2))
    assert info.value.where == f"{data}:6"
    assert fragment in info.value.message
    assert not (tmp_path / "job" / "manifest.json").exists()


@pytest.mark.parametrize(
    "content, rows",
    [
        (b"\xef\xbb\xbf" + GOOD + b"\r\n" + GOOD + b"\r\n", 2),  # BOM at the start, CRLF
        (GOOD + b"\n" + GOOD, 2),  # no final newline
        (b"  " + GOOD + b"\t\n" + GOOD + b"\n", 2),  # spaces and tabs around a row
    ],
    ids=["bom-crlf", "no-final-newline", "surrounding-blanks"],
)
def test_accepted_quirks_are_normalised(tmp_path, content, rows):
    data = tmp_path / "in.jsonl"
    data.write_bytes(content)
    outcome = prepare_job(request(tmp_path / "job", data, 1))
    assert shard_lines(tmp_path / "job") == [GOOD] * rows
    assert outcome.manifest.total_rows == rows


@pytest.mark.parametrize(
    "content, line",
    [(GOOD + b"\n\n" + GOOD + b"\n", 2), (GOOD + b"\n \t\r\n", 2), (b"\n" + GOOD, 1)],
    ids=["empty", "whitespace-crlf", "first"],
)
def test_blank_lines_are_refused_with_their_line(tmp_path, content, line):
    data = tmp_path / "in.jsonl"
    data.write_bytes(content)
    with pytest.raises(InputError, match="blank line") as info:
        prepare_job(request(tmp_path / "job", data, 1))
    assert info.value.where == f"{data}:{line}"


def test_the_first_bad_line_is_reported_when_a_block_holds_several(tmp_path):
    data = tmp_path / "in.jsonl"
    rows = [GOOD] * 3 + [b'{"a": 1, "a": 2}'] + [GOOD] * 3 + [b"[1]"] + [GOOD]
    data.write_bytes(b"\n".join(rows) + b"\n")
    with pytest.raises(InputError, match="duplicate key") as info:
        prepare_job(request(tmp_path / "job", data, 1))
    assert info.value.where == f"{data}:4"


def test_a_huge_line_is_refused_clearly_with_bounded_memory(tmp_path):
    """Policy: lines longer than elastic.max_line_bytes (64 MiB by default) are refused as soon as
    that is known; the reader never holds more than the limit plus its read blocks in flight."""
    data = tmp_path / "huge.jsonl"
    line_mib = 160
    with open(data, "wb") as handle:
        handle.write(GOOD + b"\n" + b'{"text": "')
        block = b"x" * (1 << 20)
        for _ in range(line_mib):
            handle.write(block)
        handle.write(b'"}\n' + GOOD + b"\n")
    with pytest.raises(InputError, match=f"longer than {64 * 1024 * 1024} bytes") as info:
        prepare_job(request(tmp_path / "job", data, 1))  # the default limit
    assert info.value.where == f"{data}:2"
    assert "max_line_bytes" in info.value.hint

    # Memory: a small limit, so that holding the line whole (160 MiB) and holding the limit plus
    # every block that can be in flight are far apart.  In flight at most: the prefetch queue and
    # the block its reader thread holds, the block being split, and the hash/write queue and the
    # task it runs (codecs: prefetch, BackgroundIO), each READ_BYTES.
    limit = 16 * 1024 * 1024
    in_flight = (codecs._PREFETCH_DEPTH + 1) + 1 + (codecs._PREFETCH_DEPTH + 1 + 1)
    bound = limit + in_flight * codecs.READ_BYTES
    assert bound < line_mib * 1024 * 1024, "the bound must tell a bounded reader from one holding the line"
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=f"longer than {limit} bytes"):
            prepare_job(request(tmp_path / "job-small-limit", data, 1, max_line_bytes=limit))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < bound, f"peak {peak / 2**20:.1f} MiB, bound {bound / 2**20:.0f} MiB"


def test_a_line_longer_than_a_read_block_is_handled(tmp_path):
    data = tmp_path / "long.jsonl"
    long_row = b'{"text": "' + b"y" * (20 * 1024 * 1024) + b'"}'
    data.write_bytes(GOOD + b"\n" + long_row + b"\n" + GOOD + b"\n")
    outcome = prepare_job(request(tmp_path / "job", data, 3))
    # cut near byte targets: the 20 MiB line is longer than a shard's share, so one shard is empty
    assert sum(s.rows for s in outcome.manifest.shards) == 3
    assert shard_lines(tmp_path / "job") == [GOOD, long_row, GOOD]


_TOKENS = [b"{", b"}", b"[", b"]", b'"a"', b'"b"', b'"a:b"', b":", b",", b" ", b"1", b"-0.5", b"1e400", b"NaN"]
_TOKENS += [b"9" * 310, b"e60", b"1e308", b"E+309", b".5", b"123456789012345678901", b"0"]
_TOKENS += [b"null", b"true", b'"\\ud800"', b'"\\u003a"', b'"\\""', b"\\", b"\xff", b"\r", b"\x00", b'"x"']


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS), max_size=14), st.booleans())
def test_block_path_and_reference_agree_on_arbitrary_lines(tokens, wrap):
    """Differential: whatever bytes a line holds, the fast block path accepts it iff the reference does."""
    body = b"".join(tokens)
    line = b"{" + body + b"}" if wrap else body
    ref_ok, _ = _verdict(reference_row, line.strip(b" \t\r"))
    if not line.strip(b" \t\r"):
        ref_ok = False  # blank
    rows = RowNormaliser("t.jsonl", NormaliseOptions("/", {}, None), 0)
    try:
        rows.lines([GOOD, line, GOOD])
        fast_ok = True
    except InputError as exc:
        assert exc.where == "t.jsonl:2"
        fast_ok = False
    assert fast_ok == ref_ok, line
