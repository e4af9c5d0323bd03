"""compat.dj_file_listing: Data-Juicer's local loader lists a parts export in the order of its parts,
every other directory exactly as before (on the real formatter module, with real files)."""

from __future__ import annotations

import types
from pathlib import Path

from data_juicer_elastic.compat import ALREADY, APPLIED, ORIGINAL, dj_file_listing
from data_juicer_elastic.integration.patches import parts_order
from data_juicer_elastic.jobdir.exports import PARTS_INDEX, part_name


def _parts(directory: Path, count: int, index: bool) -> list[str]:
    directory.mkdir()
    names = [part_name(f"part-{i:05d}-of-{count:05d}") for i in range(count)]
    for name in reversed(names):  # created last to first: listing order is not name order
        (directory / name).write_text('{"text": "x"}\n')
    if index:
        (directory / PARTS_INDEX).write_text("{}\n")
    return [str(directory / name) for name in names]


def test_the_target_is_where_data_juicers_local_loader_looks():
    assert "LocalFormatter.__init__" in dj_file_listing.self_check()


def test_a_parts_export_is_listed_in_part_order_and_other_directories_as_data_juicer_lists_them(tmp_path):
    from data_juicer.format import formatter

    module = types.SimpleNamespace(find_files_with_suffix=getattr(
        formatter.find_files_with_suffix, ORIGINAL, formatter.find_files_with_suffix
    ))  # fmt: skip
    original = module.find_files_with_suffix
    assert dj_file_listing.install(module, parts_order) == APPLIED
    assert dj_file_listing.install(module, parts_order) == ALREADY
    parts = _parts(tmp_path / "parts", 32, index=True)
    assert module.find_files_with_suffix(tmp_path / "parts", [".jsonl"]) == {".jsonl": parts}
    plain = _parts(tmp_path / "plain", 32, index=False)
    listed = module.find_files_with_suffix(tmp_path / "plain", [".jsonl"])
    assert listed == original(tmp_path / "plain", [".jsonl"]) and sorted(listed[".jsonl"]) == plain
    single = module.find_files_with_suffix(parts[3], [".jsonl"])
    assert single == {".jsonl": [parts[3]]}


def test_the_plugin_installs_it_in_data_juicer():
    from data_juicer.format import formatter

    import data_juicer_elastic.integration.patches as patches
    from data_juicer_elastic.integration import patch_records

    patches.install()
    assert getattr(formatter.find_files_with_suffix, ORIGINAL, None) is not None
    assert patch_records.RECORDS[patch_records.FILE_LISTING].state == "applied"
