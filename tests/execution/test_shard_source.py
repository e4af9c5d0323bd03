"""execution.shard_reader: Data-Juicer's Ray loader gets the shard as this package read it,
only while the shard runs, only for that path."""

from __future__ import annotations

import inspect
import json
import threading

import pytest
from data_juicer.core.data.ray_dataset import RayDataset

from data_juicer_elastic.compat.dj_ops_internals import RAY_DATASET_READ as TARGET
from data_juicer_elastic.errors import InputChangedError, IntegrationError
from data_juicer_elastic.execution import shard_reader
from data_juicer_elastic.execution.shard_reader import InputRows, shard_source
from data_juicer_elastic.rows.codecs import READ_BYTES

from .conftest import file_source, schema_of, write_shard


def _read_attr():
    return inspect.getattr_static(RayDataset, "read")


def test_patch_is_active_only_inside_and_nested_runs_share_it(tmp_path):
    original = _read_attr()
    with shard_source(tmp_path / "a.jsonl", lambda: "A"):
        patched = _read_attr()
        assert patched is not original and isinstance(patched, classmethod)
        with shard_source(tmp_path / "b.jsonl", lambda: "B"):  # a second shard run (another slot thread)
            assert _read_attr() is patched
            assert RayDataset.read("json", str(tmp_path / "b.jsonl")) == "B"
        assert _read_attr() is patched  # the inner run ending must not unpatch the outer one
        assert RayDataset.read("json", str(tmp_path / "a.jsonl")) == "A"
        with pytest.raises(IntegrationError, match="only the shard is read"):
            RayDataset.read("json", str(tmp_path / "b.jsonl"))
    assert _read_attr() is original and not shard_reader._sources


def test_patch_is_restored_when_the_shard_run_fails(tmp_path):
    original = _read_attr()
    with pytest.raises(RuntimeError, match="boom"), shard_source(tmp_path / "a.jsonl", lambda: None):
        raise RuntimeError("boom")
    assert _read_attr() is original


def test_threads_overlapping_restore_the_original_once_all_are_done(tmp_path):
    original = _read_attr()
    inside, release = threading.Barrier(3), threading.Event()

    def shard_run(name):
        with shard_source(tmp_path / name, lambda: name):
            inside.wait()
            release.wait()

    threads = [threading.Thread(target=shard_run, args=(f"{i}.jsonl",)) for i in range(2)]
    for thread in threads:
        thread.start()
    inside.wait()
    assert _read_attr() is not original
    release.set()
    for thread in threads:
        thread.join()
    assert _read_attr() is original and not shard_reader._sources


def test_a_moved_internal_gives_one_integration_error(monkeypatch, tmp_path):
    monkeypatch.setattr(RayDataset, "read", staticmethod(lambda *a, **k: None))
    with pytest.raises(IntegrationError, match="RayDataset.read is missing or no longer a classmethod") as info:
        with shard_source(tmp_path / "a.jsonl", lambda: None):
            pass
    assert info.value.where == "py-data-juicer" and TARGET in str(info.value)
    assert not shard_reader._sources


@pytest.mark.ray
def test_the_shard_comes_back_read_with_the_job_schema(ray_runtime, tmp_path):
    import ray
    from ray.data.dataset import MaterializedDataset

    from data_juicer_elastic.execution.shard_reader import ROW_COLUMN, ArrowRows, read_tables

    shard = write_shard(tmp_path / "s.jsonl", 50)
    rows = ArrowRows.from_manifest(schema_of(shard), where="test")
    tables = read_tables(file_source(shard, "part-00000-of-00001"), rows, block_bytes=1024)
    with shard_source(shard, lambda: ray.data.from_arrow(tables)):
        dataset = RayDataset.read("json", str(shard))
    assert isinstance(dataset, MaterializedDataset) and dataset.num_blocks() > 1
    assert dataset.columns() == ["text", "idx", "meta", ROW_COLUMN]
    taken = dataset.take_all()
    assert [row["idx"] for row in taken] == list(range(50)) == [row[ROW_COLUMN] for row in taken]


def test_input_rows_starting_a_pass_again_check_the_pass_they_give_up(tmp_path):
    """A row the writer's cursor handed out from a pass it then gives up (an earlier row asked for) is checked
    against the scan too: that pass is read to its end first.  The shard is over one read block, so a pass
    hands out its first rows before it reads the end, where the content's sha256 is compared."""
    path = tmp_path / "in.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        while handle.tell() <= READ_BYTES:
            handle.write(json.dumps({"idx": 0, "text": "x" * 4000}) + "\n")
    source = file_source(path, "part-00000-of-00001")
    scanned = path.read_bytes()
    path.write_bytes(scanned.replace(b'"idx": 0', b'"idx": 7', 2))  # the first two rows, same size
    inputs = InputRows(source)
    try:
        assert inputs.get(1)["idx"] == 7, "handed out before the pass read its end"
        path.write_bytes(scanned)  # restored: the next pass reads the scanned content
        with pytest.raises(InputChangedError):
            inputs.get(0)
    finally:
        inputs.close()
