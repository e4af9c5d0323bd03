"""Fault matrix row 22: spaces, quotes, shell characters and non-ASCII letters in the paths of a job.

Data-Juicer splits its ``dataset_path`` on spaces into weighted paths; the shard path a run
gives it (only a key: ``execution.shard_reader`` serves the shard) is shell-quoted, so a
``job_dir`` with a space runs like any other.  Through ``dj-process``, the command a user runs,
with such characters in ``job_dir``, ``dataset_path`` and ``export_path`` at once.
"""

from __future__ import annotations

import json
import shlex

import pytest

from data_juicer_elastic.jobdir.attempts import requeue_hint
from data_juicer_elastic.jobdir.layout import JobLayout

from .commands import dj_elastic, dj_process, recipe
from .fakes import write_input

pytestmark = [pytest.mark.ray, pytest.mark.e2e]

ODD = "a b 'q' \"d\" $HOME; & #é 数据"  # what a shell or Data-Juicer's weighted paths would take apart


def test_a_job_whose_paths_hold_spaces_quotes_and_unicode_runs_end_to_end(tmp_path):
    base = tmp_path / ODD
    data = write_input(base / f"in {ODD}.jsonl", 12)
    job = base / f"job {ODD}"
    export = base / f"out {ODD}" / f"merged {ODD}.jsonl"
    proc = dj_process(recipe(base, data, job, export=export))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Unable to load" not in proc.stderr and "not a valid local path" not in proc.stderr
    inputs = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
    expected = [{**row, "text": row["text"].strip()} for row in inputs]  # whitespace_normalization_mapper
    assert [json.loads(line) for line in export.read_text(encoding="utf-8").splitlines()] == expected

    # the closing summary's command can be pasted into a shell as it is printed
    (printed,) = [line.split("report  ", 1)[1] for line in proc.stderr.splitlines() if "report  dj-elastic" in line]
    argv = shlex.split(printed)
    assert argv[:3] == ["dj-elastic", "report", "--job-dir"] and (base / argv[3]).resolve() == job.resolve()
    assert dj_elastic("verify", "--job-dir", job).returncode == 0


def test_a_requeue_hint_quotes_the_job_dir(tmp_path):
    job = tmp_path / ODD
    argv = shlex.split(requeue_hint(JobLayout(job), ["part-00000-of-00002"]).split("`")[1])
    assert argv == ["dj-elastic", "retry", "--job-dir", str(job), "--shard-id", "part-00000-of-00002"]
