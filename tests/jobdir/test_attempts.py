from __future__ import annotations

import errno
import json
import os

import pytest

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.jobdir import attempts, task_queue
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.records import TakeoverReason
from data_juicer_elastic.sharedfs import fsio

from .conftest import identity

SHARD = "part-00001-of-00004"


def _claim(layout, who, reason=TakeoverReason.FIRST):
    view = task_queue.read_lease(layout, SHARD)
    return task_queue.publish_claim(layout, view, who, who.new_attempt_id(), reason)


def _output(layout, claim, rows=3, text="x"):
    directory = layout.attempt_dir(SHARD, claim.attempt_id)
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "output.jsonl"
    out.write_text("".join(json.dumps({"i": i, "t": text}) + "\n" for i in range(rows)))
    return out


def _publish(layout, claim, out, **kw):
    entry = load_manifest(layout.root).shard(SHARD)
    return attempts.publish_done(layout, claim, out, input_rows=entry.rows, input_sha256=entry.sha256, **kw)


def test_first_publication_wins_and_a_zombie_is_discarded(job):
    layout = JobLayout(job)
    zombie = _claim(layout, identity("zombie"))
    task_queue.release_claim(layout, zombie, "finished")  # stands in for "went stale"
    taker = _claim(layout, identity("taker"), TakeoverReason.RELEASED)
    zombie_out, taker_out = _output(layout, zombie, text="zombie"), _output(layout, taker, text="taker")
    first = _publish(layout, taker, taker_out, declared_rows=3)
    assert first.accepted and first.winner.attempt_id == taker.attempt_id
    before = layout.done(SHARD).read_bytes()
    late = _publish(layout, zombie, zombie_out)
    assert not late.accepted and late.winner.attempt_id == taker.attempt_id
    assert layout.done(SHARD).read_bytes() == before, "accepted output is never overwritten"
    result, error = attempts.read_done(layout, SHARD)
    assert error is None and result.rows == 3 and result.output.endswith("output.jsonl")
    attempts.validate_result(layout, load_manifest(job).shard(SHARD), result)


def test_done_link_that_reported_eio_is_recognised_as_ours(job, monkeypatch):
    layout = JobLayout(job)
    c = _claim(layout, identity("a"))
    out = _output(layout, c)
    real_link = os.link

    def lying(src, dst):
        real_link(src, dst)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fsio.os, "link", lying)
    assert _publish(layout, c, out).accepted


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda p: p.write_bytes(b'{"a": 1}\n{"a": '), "no newline"),
        (lambda p: p.write_bytes(b'{"a": 1}\nnot json\n'), "not valid JSON"),
        (lambda p: p.write_bytes(b'{"a": 1}\n[1]\n'), "not a JSON object"),
        (lambda p: p.unlink(), "does not exist"),
    ],
)
def test_invalid_outputs_are_refused_and_nothing_is_published(job, mutate, message):
    layout = JobLayout(job)
    c = _claim(layout, identity("a"))
    out = _output(layout, c)
    mutate(out)
    with pytest.raises(IntegrityError, match=message) as info:
        _publish(layout, c, out)
    assert SHARD in info.value.where
    assert not layout.done(SHARD).exists()


def test_declared_numbers_must_match_and_output_must_be_inside_the_attempt(job, tmp_path):
    layout = JobLayout(job)
    c = _claim(layout, identity("a"))
    out = _output(layout, c, rows=3)
    with pytest.raises(IntegrityError, match="rows=4"):
        _publish(layout, c, out, declared_rows=4)
    with pytest.raises(IntegrityError, match="sha256"):
        _publish(layout, c, out, declared_sha256="0" * 64)
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text('{"a": 1}\n')
    with pytest.raises(IntegrityError, match="not inside the attempt directory"):
        _publish(layout, c, outside)


def test_retry_budget_ends_in_a_terminal_failure(job):
    layout = JobLayout(job)
    me = identity("me")
    for generation in (1, 2, 3):
        c = _claim(layout, me, TakeoverReason.FAILED if generation > 1 else TakeoverReason.FIRST)
        outcome = task_queue.record_failure(
            layout,
            c,
            shard_id=SHARD,
            generation=c.generation,
            error=f"boom {generation}",
            error_type="ValueError",
            exit_reason="error",
            max_retries=2,
            reporter=me,
        )
        assert outcome.recorded and outcome.failures == generation
        assert (outcome.terminal is not None) == (generation == 3)
    terminal, _ = task_queue.read_terminal(layout, SHARD)
    assert terminal.failures == 3 and terminal.last_error == "boom 3" and terminal.generations == [1, 2, 3]
    again = task_queue.record_failure(
        layout, c, shard_id=SHARD, generation=3, error="dup", error_type="E", exit_reason="error",
        max_retries=2, reporter=me,
    )  # fmt: skip
    assert not again.recorded and again.failures == 3


def test_terminal_marker_is_completed_after_a_crash_between_failure_and_marker(job):
    layout = JobLayout(job)
    me = identity("me")
    c = _claim(layout, me)
    task_queue.record_failure(
        layout, c, shard_id=SHARD, generation=1, error="x", error_type="E", exit_reason="error",
        max_retries=5, reporter=me,
    )  # fmt: skip
    assert task_queue.publish_terminal_if_exhausted(layout, SHARD, max_retries=5) is None
    assert task_queue.publish_terminal_if_exhausted(layout, SHARD, max_retries=0) is not None
    assert layout.failed(SHARD).exists()


def test_error_text_is_the_last_line():
    assert (
        attempts.error_text(RuntimeError("Traceback...\n  File x\nValueError: bad row 7\n")) == "ValueError: bad row 7"
    )
    assert attempts.error_text(RuntimeError("")) == "RuntimeError"
