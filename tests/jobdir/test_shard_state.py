"""The one shard-state rule (jobdir.shard_state), the shared staleness rule (jobdir.heartbeats)
and reason codes that parse to their StrEnum (jobdir.records) with records unchanged."""

from __future__ import annotations

import json

import pytest

from data_juicer_elastic.jobdir.heartbeats import PeriodicThread, Sighting, StalenessObserver, looks_stale
from data_juicer_elastic.jobdir.records import (
    DEATH_REASONS,
    FailureReason,
    Release,
    ReleaseReason,
    ShardResult,
    TerminalFailure,
)
from data_juicer_elastic.jobdir.shard_state import Markers, ShardState, decide_state

SHARD = "part-00000-of-00001"
RESULT = ShardResult(SHARD, "a", 1, "n", 1, 2, "s", "out", 1, "i", 0.0)
TERMINAL = TerminalFailure(SHARD, 1, 0, "poison row", "a", [1], 0.0)


@pytest.mark.parametrize(
    ("markers", "held", "stale", "state", "error"),
    [
        (Markers(SHARD, result=RESULT), True, True, ShardState.DONE, None),
        (Markers(SHARD, known_done=True), False, False, ShardState.DONE, None),
        (Markers(SHARD, done_error="torn"), True, False, ShardState.FAILED, "corrupt done marker: torn"),
        (Markers(SHARD, terminal=TERMINAL), True, False, ShardState.FAILED, "poison row"),
        (Markers(SHARD, terminal_error="torn"), False, False, ShardState.FAILED, "corrupt failed marker: torn"),
        (Markers(SHARD), False, True, ShardState.PENDING, None),
        (Markers(SHARD), True, False, ShardState.RUNNING, None),
        (Markers(SHARD), True, True, ShardState.STALE, None),
    ],
)
def test_one_rule_decides_every_state(markers, held, stale, state, error):
    assert decide_state(markers, held=held, stale=stale) is state
    assert markers.last_error == error
    assert (markers.terminal_info is not None) == (state is ShardState.FAILED)


def test_staleness_is_judged_on_the_observers_clock_for_any_heartbeat():
    now = [0.0]
    observer = StalenessObserver(10.0, lambda: now[0])
    assert not observer.is_stale(Sighting("prepare", ("i", 1)))
    now[0] = 9.0
    assert not observer.is_stale(Sighting("prepare", ("i", 2))), "a changed value restarts the clock"
    now[0] = 19.0
    assert observer.is_stale(Sighting("prepare", ("i", 2)))
    assert looks_stale(11.0, 10) and not looks_stale(None, 10) and not looks_stale(11.0, None)


def test_renew_thread_stops_when_the_heartbeat_is_no_longer_ours():
    calls = []
    thread = PeriodicThread(0.01, lambda: calls.append(1) or len(calls) < 3, "test-renew", first_tick=True)
    thread.start()
    thread._thread.join(timeout=5)
    assert len(calls) == 3
    thread.stop()


def test_reason_codes_parse_to_members_and_encode_unchanged():
    record = Release(SHARD, 1, "a", ReleaseReason.FINISHED, 1.0)
    data = record.encode()
    assert json.loads(data)["reason"] == "finished"
    parsed = Release.parse(data, "release")
    assert parsed.reason is ReleaseReason.FINISHED and parsed == record and parsed.encode() == data
    newer = data.replace(b'"finished"', b'"a-newer-reason"')
    assert Release.parse(newer, "release").reason == "a-newer-reason", "an unknown code is kept, not refused"
    assert FailureReason.ERROR not in DEATH_REASONS and "lease-expired" in DEATH_REASONS
