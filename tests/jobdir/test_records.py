from __future__ import annotations

import json

import pytest

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir.exports import MergeRecord
from data_juicer_elastic.jobdir.manifest import manifest_recipe_hash
from data_juicer_elastic.jobdir.records import (
    AttemptRecord,
    Claim,
    Failure,
    Heartbeat,
    Release,
    ShardResult,
    TerminalFailure,
)
from data_juicer_elastic.jobdir.shard_state import ShardState

SAMPLES = [
    Claim("part-00000-of-00001", 1, "a1", "n", "h", "b", 7, "pid:[1]", 1.5, 0, "none"),
    Heartbeat("part-00000-of-00001", 1, "a1", 3, 2.0),
    Release("part-00000-of-00001", 1, "a1", "finished", 2.0),
    AttemptRecord("part-00000-of-00001", "a1", 1, "n", "h", "b", 7, 1.0, 2.0, 5, "done", None),
    ShardResult("part-00000-of-00001", "a1", 1, "n", 5, 100, "0" * 64, "attempts/x/a1/output.jsonl", 5, "1" * 64, 3.0),
    Failure("part-00000-of-00001", 1, "a1", "n", "h", 7, "boom", "ValueError", "error", 2.0),
    TerminalFailure("part-00000-of-00001", 4, 3, "boom", "a1", [1, 2, 3, 4], 9.0),
    MergeRecord("/out.jsonl", 5, 100, "0" * 64, "job", "1" * 64),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: r.KIND)
def test_round_trip(record):
    data = record.encode()
    obj = json.loads(data)
    assert obj["format"] == f"dj-elastic/{record.KIND}" and obj["version"] == 1
    assert type(record).parse(data, "f.json") == record


def test_malformed_records_never_parse():
    claim = SAMPLES[0]
    data = claim.encode()
    for bad in (
        data[: len(data) // 2],
        b"",
        b"[]",
        b"\xff\xfe",
        data.replace(b'"generation": 1', b'"generation": "1"'),
    ):
        with pytest.raises(JobDirError) as info:
            Claim.parse(bad, "claims/x/gen-000001.json")
        assert "claims/x/gen-000001.json" in str(info.value)


def test_missing_field_wrong_kind_and_bool_for_int_are_refused():
    obj = json.loads(SAMPLES[0].encode())
    del obj["pid"]
    with pytest.raises(JobDirError, match="missing field 'pid'"):
        Claim.parse(json.dumps(obj).encode(), "c")
    with pytest.raises(JobDirError, match="not a dj-elastic claim"):
        Claim.parse(SAMPLES[1].encode(), "c")
    obj = json.loads(SAMPLES[0].encode())
    obj["pid"] = True
    with pytest.raises(JobDirError, match="'pid'"):
        Claim.parse(json.dumps(obj).encode(), "c")


def test_newer_version_is_refused_clearly_and_extra_fields_ignored():
    obj = json.loads(SAMPLES[1].encode())
    obj["version"] = 2
    with pytest.raises(JobDirError, match="version 2") as info:
        Heartbeat.parse(json.dumps(obj).encode(), "hb")
    assert "upgrade" in info.value.hint
    obj["version"] = 1
    obj["future_field"] = [1]
    assert Heartbeat.parse(json.dumps(obj).encode(), "hb") == SAMPLES[1]


def test_nan_is_not_a_valid_record():
    data = SAMPLES[1].encode().replace(b'"written_at": 2.0', b'"written_at": NaN')
    with pytest.raises(JobDirError):
        Heartbeat.parse(data, "hb")


def test_state_names_and_recipe_hash_is_order_independent():
    assert [s.value for s in ShardState] == ["pending", "running", "stale", "done", "failed"]
    assert manifest_recipe_hash({"a": 1, "b": [1, {"c": 2}]}) == manifest_recipe_hash({"b": [1, {"c": 2}], "a": 1})
    assert manifest_recipe_hash({"a": 1}) != manifest_recipe_hash({"a": 2})


_CONCURRENT_FIRST_PARSES = """
import dataclasses, enum, sys, threading
from data_juicer_elastic.jobdir.records import Record

sys.setswitchinterval(1e-6)  # a thread switch between any two bytecodes: the race shows in a few classes


class Code(enum.StrEnum):
    A = "a"


for i in range(400):  # fresh classes: each one's type info is built by whichever thread gets there first
    Inner = dataclasses.make_dataclass(f"Inner{i}", [("x", int), ("y", "str | None", dataclasses.field(default=None))])
    fields = [("a", int), ("b", list[Inner]), ("c", Code | None, dataclasses.field(default=None))]
    Rec = dataclasses.make_dataclass(f"Rec{i}", fields, bases=(Record,), frozen=True)
    Rec.KIND = "probe"
    data = b'{"format":"dj-elastic/probe","version":1,"a":1,"b":[{"x":2}],"c":"a"}'
    start = threading.Barrier(3)

    def parse(data=data, Rec=Rec, start=start):
        start.wait()
        assert Rec.parse(data, "probe").b[0].x == 2
        assert Rec.from_object({"format": "dj-elastic/probe", "version": 1, "a": 1, "b": []}, "probe").a == 1

    threads = [threading.Thread(target=parse) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
print("ok")
"""


def test_threads_parsing_a_record_kind_for_the_first_time_at_once_do_not_crash():
    """A worker's heartbeat thread and its main thread read claim records at the same time; msgspec
    builds a record class's type info on first use, unguarded, so two first uses at once read it half
    built (SIGSEGV, seen in CI as a worker dying with -11). Every type info is built under one lock."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _CONCURRENT_FIRST_PARSES], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr[-3000:])
