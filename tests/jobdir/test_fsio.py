from __future__ import annotations

import errno
import os

import pytest

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.sharedfs import fault_seam, fsio


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "a.json"
    fsio.atomic_write(target, b"one")
    fsio.atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["a.json"]


def test_atomic_write_surfaces_close_errors_and_cleans_up(tmp_path, monkeypatch):
    real_close = os.close

    def failing_close(fd):
        real_close(fd)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsio.os, "close", failing_close)
    with pytest.raises(OSError) as info:
        fsio.atomic_write(tmp_path / "a.json", b"data")
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC and "a.json" in str(info.value)
    assert os.listdir(tmp_path) == []


def test_publish_exclusive_first_wins(tmp_path):
    assert fsio.publish_bytes(tmp_path / "done.json", b"mine")
    assert not fsio.publish_bytes(tmp_path / "done.json", b"theirs")
    assert (tmp_path / "done.json").read_bytes() == b"mine"
    assert fsio.publish_bytes(tmp_path / "done.json", b"mine"), "identical content counts as ours"
    assert sorted(os.listdir(tmp_path)) == ["done.json"]


def test_publish_exclusive_recognises_a_link_that_succeeded_but_reported_eio(tmp_path, monkeypatch):
    real_link = os.link

    def lying_link(src, dst):
        real_link(src, dst)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fsio.os, "link", lying_link)
    assert fsio.publish_bytes(tmp_path / "r.json", b"ours")
    assert (tmp_path / "r.json").read_bytes() == b"ours"
    # EIO and the target holds someone else's content: not ours.
    (tmp_path / "x.json").write_bytes(b"theirs")

    def eio_only(src, dst):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fsio.os, "link", eio_only)
    assert not fsio.publish_bytes(tmp_path / "x.json", b"ours")


def test_publish_exclusive_retries_transient_estale_then_gives_up(tmp_path, monkeypatch):
    calls = []
    real_link = os.link

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) < 3:
            raise OSError(errno.ESTALE, "Stale file handle")
        real_link(src, dst)

    monkeypatch.setattr(fsio.os, "link", flaky)
    assert fsio.publish_bytes(tmp_path / "r.json", b"x") and len(calls) == 3

    def always(src, dst):
        raise OSError(errno.ESTALE, "Stale file handle")

    monkeypatch.setattr(fsio.os, "link", always)
    with pytest.raises(OSError):
        fsio.publish_bytes(tmp_path / "s.json", b"x")
    assert not (tmp_path / "s.json").exists()


def test_read_record_is_bounded_and_missing_is_none(tmp_path):
    assert fsio.read_record(tmp_path / "missing.json") is None
    (tmp_path / "big.json").write_bytes(b"x" * 101)
    with pytest.raises(JobDirError, match="larger than 100"):
        fsio.read_record(tmp_path / "big.json", max_bytes=100)
    assert fsio.read_record(tmp_path / "big.json", max_bytes=101) == b"x" * 101


def test_fault_hook_sees_operations(tmp_path):
    seen = []
    fault_seam.set_fault_hook(lambda op, path: seen.append((op, path.name)))
    try:
        fsio.publish_bytes(tmp_path / "r.json", b"x")
    finally:
        fault_seam.set_fault_hook(None)
    assert ("link", "r.json") in seen


def test_buffered_writer_abort_removes_the_file(tmp_path):
    writer = fsio.BufferedCheckedWriter(tmp_path / "out.jsonl", buffer_bytes=4)
    writer.write(b"0123456789")
    writer.abort()
    assert not (tmp_path / "out.jsonl").exists()
    assert fsio.list_names(tmp_path / "nope") == []


def test_preallocate_reserves_space_without_changing_the_size_and_failures_are_only_hints(tmp_path, monkeypatch):
    import os

    path = tmp_path / "big.bin"
    writer = fsio.BufferedCheckedWriter(path, size_hint=8 << 20)
    reserved = os.stat(path).st_blocks * 512
    writer.write(b"x" * 1000)
    writer.finish()
    assert os.stat(path).st_size == 1000, "the size is what was written, not what was reserved"
    assert reserved == 0 or reserved >= 8 << 20  # 0 where the filesystem has no fallocate
    monkeypatch.setattr(fsio, "_fallocate", lambda *args: -1)  # e.g. EOPNOTSUPP on NFSv3
    other = fsio.BufferedCheckedWriter(tmp_path / "other.bin", size_hint=1 << 20)
    other.write(b"y\n")
    other.finish()
    assert (tmp_path / "other.bin").read_bytes() == b"y\n"
