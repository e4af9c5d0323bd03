"""Fault matrix row 15: the merge writes only the export path and its siblings, never through a
link and never into the job directory.

Through ``dj-elastic merge`` / ``verify`` and ``dj-process`` in subprocesses.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from .commands import SHARD0, dj_elastic, dj_process, error_line, finished_job, recipe, small_input, tree
from .fakes import merged_ids


def _outside(tmp: Path) -> Path:
    path = tmp / "elsewhere"
    path.mkdir()
    return path


def test_a_dangling_link_at_the_export_path_is_refused_and_nothing_is_created_where_it_points(tmp_path):
    job = finished_job(tmp_path)
    elsewhere = _outside(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    link = out_dir / "merged.jsonl"
    link.symlink_to(elsewhere / "target.jsonl")  # dangling: following it would create the target
    line = error_line(dj_elastic("merge", "--job-dir", job, "--output", link))
    assert "symlink is at the export path" in line and str(link) in line
    assert tree(elsewhere) == {}, "nothing may be created where the link points"
    assert link.is_symlink() and sorted(p.name for p in out_dir.iterdir()) == ["merged.jsonl"]


def test_with_overwrite_the_links_themselves_are_replaced_and_their_targets_left_alone(tmp_path):
    job = finished_job(tmp_path)
    elsewhere = _outside(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for name in ("merged.jsonl", "merged_overall_stats.json", "merged_overall_stats.csv"):
        (elsewhere / name).write_text("precious\n")
        (out_dir / name).symlink_to(elsewhere / name)
    before = tree(elsewhere)
    proc = dj_elastic("merge", "--job-dir", job, "--output", out_dir / "merged.jsonl", "--overwrite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert tree(elsewhere) == before, "a link's target was written through"
    for name in ("merged.jsonl", "merged_overall_stats.json", "merged_overall_stats.csv"):
        assert not (out_dir / name).is_symlink() and (out_dir / name).is_file(), name
    assert merged_ids(out_dir / "merged.jsonl") == list(range(40))


@pytest.mark.parametrize("target", ["manifest.json", f"shards/{SHARD0}.jsonl", "elsewhere-in-job.jsonl"])
def test_merge_refuses_an_output_inside_the_job_dir_and_leaves_the_job_intact(tmp_path, target):
    job = finished_job(tmp_path)
    before = tree(job)
    line = error_line(dj_elastic("merge", "--job-dir", job, "--output", job / target, "--overwrite"))
    assert "--output" in line and "inside the job directory" in line
    assert tree(job) == before
    proc = dj_elastic("verify", "--job-dir", job)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_merge_refuses_an_output_reaching_the_job_dir_through_a_linked_parent(tmp_path):
    job = finished_job(tmp_path)
    alias = tmp_path / "alias"
    alias.symlink_to(job, target_is_directory=True)
    line = error_line(dj_elastic("merge", "--job-dir", job, "--output", alias / "manifest.json", "--overwrite"))
    assert "inside the job directory" in line


@pytest.mark.parametrize("key", ["export_path", pytest.param("work_dir", marks=pytest.mark.extended)])
def test_dj_process_refuses_output_paths_inside_a_fresh_job_dir_before_writing_anything(tmp_path, key):
    data = small_input(tmp_path)
    job = tmp_path / "job"
    fields = {"export_path": job / "merged.jsonl"} if key == "export_path" else {"work_dir": str(job / "work")}
    export = fields.pop("export_path", tmp_path / "out" / "merged.jsonl")
    line = error_line(dj_process(recipe(tmp_path, data, job, export=export, **fields)))
    assert key in line and "inside the job directory" in line
    assert not job.exists() or not any(job.iterdir()), f"the job dir was written: {tree(job)}"
    # ... and it is still usable: the same job with the paths outside it runs through prepare
    proc = dj_elastic("prepare", "--config", recipe(tmp_path, data, job, export=tmp_path / "out" / "m.jsonl"))
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_verify_checks_every_input_shard_against_the_manifest(tmp_path):
    job = finished_job(tmp_path)
    shard = job / "shards" / f"{SHARD0}.jsonl"
    data = shard.read_bytes()
    shard.unlink()  # a new file, not an edit in place: the shard may be a hard link
    shard.write_bytes(data.replace(b"row 0", b"row X", 1))
    line = error_line(dj_elastic("verify", "--job-dir", job))
    assert SHARD0 in line and "input shard" in line and hashlib.sha256(shard.read_bytes()).hexdigest() in line
