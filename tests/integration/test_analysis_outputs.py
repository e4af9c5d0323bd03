"""Which files `dj-analyze` is refused to write (integration.analysis_outputs); the command itself:
tests/e2e/test_demo_job.py (the refusal, exit 2, the job's row stats untouched)."""

from __future__ import annotations

import json

import pytest

from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.integration.analysis_outputs import analyzer_targets, refuse_overwrites
from data_juicer_elastic.jobdir.exports import MergeRecord


def _merged_job(tmp_path, **record):
    job, export = tmp_path / "job", tmp_path / "out" / "merged.jsonl"
    job.mkdir()
    export.parent.mkdir()
    export.write_text('{"text": "a"}\n')
    stats = export.with_name("merged_stats.jsonl")
    stats.write_text('{"__dj__stats__":{"text_len":1}}\n')
    fields = dict(output_path=str(export), rows=1, bytes=1, sha256="0" * 64, job_id="j", content_sha256="0" * 64)
    fields.update(row_stats_path=str(stats), row_stats_sha256="0" * 64, **record)
    (job / "merge.json").write_bytes(MergeRecord(**fields).encode())
    return job, export, stats


def _elastic(job, export, **fields):
    return {"executor_type": "elastic_sharded", "export_path": str(export), "elastic": {"job_dir": str(job)}} | fields


def test_the_analyzer_writes_the_stats_beside_export_path_and_the_data_only_when_asked(tmp_path):
    export = tmp_path / "a.jsonl"
    assert analyzer_targets({"export_path": str(export)}) == [tmp_path / "a_stats.jsonl"]
    both = analyzer_targets({"export_path": str(export), "export_original_dataset": True})
    assert both == [tmp_path / "a_stats.jsonl", export]
    assert analyzer_targets({"export_path": "s3://bucket/a.jsonl"}) == []


def test_the_row_stats_merge_json_names_are_refused_naming_the_file_and_a_way_out(tmp_path):
    job, export, stats = _merged_job(tmp_path)
    with pytest.raises(ConfigError) as refused:
        refuse_overwrites(_elastic(job, export))
    text = str(refused.value)
    assert f"would overwrite {stats}, which is the row stats the elastic job {job} published" in text
    assert f"--export_path {tmp_path / 'out' / 'analysis' / 'merged.jsonl'}" in text
    refuse_overwrites(_elastic(job, tmp_path / "out" / "analysis" / "merged.jsonl"))  # the way out


def test_with_export_original_dataset_the_merged_output_itself_is_refused(tmp_path):
    job, export, stats = _merged_job(tmp_path)
    stats.unlink()
    with pytest.raises(ConfigError, match="which is the merged output the elastic job"):
        refuse_overwrites(_elastic(job, export, export_original_dataset=True))


def test_any_recipe_is_refused_beside_an_export_finalize_marked_elastic(tmp_path):
    _, export, stats = _merged_job(tmp_path)
    plain = {"executor_type": "default", "export_path": str(export)}
    refuse_overwrites(plain)  # nothing says the export is an elastic job's: Data-Juicer's own behaviour
    marker = export.with_name("merged_overall_stats.json")
    marker.write_text(json.dumps({"format": "something else"}))
    refuse_overwrites(plain)
    marker.write_text(json.dumps({"format": "dj-elastic/overall-stats", "version": 1}))
    with pytest.raises(ConfigError, match="merged_overall_stats.json says so"):
        refuse_overwrites(plain)
    marker.unlink()
    export.with_name("merged.jsonl.progress.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"merged\.jsonl\.progress\.json says so"):
        refuse_overwrites(plain)


def test_a_corrupt_merge_record_falls_back_to_the_markers(tmp_path):
    job, export, _ = _merged_job(tmp_path)
    (job / "merge.json").write_text("{not json")
    refuse_overwrites(_elastic(job, export))  # no marker: nothing to protect is known
