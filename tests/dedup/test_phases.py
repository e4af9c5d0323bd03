"""The deduplication phases in one process (``dedup.phases`` through ``jobdir.worker.run_worker``), with the
fault driver's fake runners: exact dedup computed in Python.  Hypothesis over corpora (copies far apart, case
and whitespace variants, empty documents) and shard counts: the merged output is the oracle's rows (each
deduplicator keeping the first row of each hash among the rows reaching it, as the default executor)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.console.summary import summary_lines
from data_juicer_elastic.dedup import phases as dedup_phases_module
from data_juicer_elastic.dedup.keys import minhash_keys
from data_juicer_elastic.dedup.phase_progress import dedup_progress, removed_rows
from data_juicer_elastic.dedup.phases import dedup_phases
from data_juicer_elastic.dedup.simhash_blocks import simhash_keys
from data_juicer_elastic.errors import ConfigError, ShardFailedError
from data_juicer_elastic.jobdir.attempts import SignatureOutput
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.manifest import load_manifest
from data_juicer_elastic.jobdir.worker import WorkerSettings, run_worker
from data_juicer_elastic.rows.shard_source import iter_source_lines
from data_juicer_elastic.shards.merge import merge_job
from data_juicer_elastic.shards.prepare import PrepareRequest, prepare_job
from data_juicer_elastic.sharedfs.identity import WorkerIdentity
from tests.faults.fakes import DEDUP_PROCESS, LEASE, dedup_oracle, dedup_runner, fake_signatures

SETTINGS = WorkerSettings(max_retries=1, **LEASE)
WORDS = ["doc a", "Doc A", "  doc a ", "doc b", "DOC B", "", "doc c", "doc a x"]


def run_job(root: Path, texts: list[str], shards: int, process=DEDUP_PROCESS, runner=None):
    data = root / "input.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    job = root / "job"
    prepare_job(PrepareRequest(job_dir=job, dataset_path=data, num_shards=shards, recipe={"process": process},
                               stage_identities=["copy"]))  # fmt: skip
    summary = run_worker(
        job, WorkerIdentity.current(), dedup_runner(process), SETTINGS,
        phases=dedup_phases(runner or fake_signatures(process)),
    )  # fmt: skip
    assert summary.complete, summary
    out = root / "out.jsonl"
    result = merge_job(job, out)
    return job, [json.loads(line)["id"] for line in out.open()], result


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(st.sampled_from(WORDS), min_size=1, max_size=30),
    shards=st.integers(1, 30),
    second=st.booleans(),
)
def test_the_job_keeps_the_oracles_rows_for_any_corpus_and_shard_count(texts, shards, second):
    process = DEDUP_PROCESS if second else DEDUP_PROCESS[:2]
    with tempfile.TemporaryDirectory() as tmp:
        job, kept, result = run_job(Path(tmp), texts, min(shards, len(texts)), process)
        assert kept == dedup_oracle(texts, process)
        counts = removed_rows(JobLayout(job), load_manifest(job))
        assert [c["stage"] for c in counts] == list(range(1, len(process)))
        assert sum(c["dropped"] for c in counts) == sum(1 for t in texts if t) - len(kept)
        assert list(result.dedup) == counts


def test_a_runner_of_another_method_fails_the_signature_task(tmp_path):
    fake = fake_signatures(DEDUP_PROCESS)

    def wrong(task):
        output = fake(task)
        return type(output)(output.rows, output.keys, "minhash")

    with pytest.raises(ShardFailedError, match="signatures part-00000-of-00002 failed 2 time.*'minhash' keys"):
        run_job(tmp_path, WORDS, 2, runner=wrong)


def test_a_deduplicating_recipe_without_a_signature_runner_is_refused(tmp_path):
    data = tmp_path / "input.jsonl"
    data.write_text(json.dumps({"id": 0, "text": "a"}) + "\n")
    job = tmp_path / "job"
    prepare_job(PrepareRequest(job_dir=job, dataset_path=data, num_shards=1, recipe={"process": DEDUP_PROCESS},
                               stage_identities=["copy"]))  # fmt: skip
    with pytest.raises(ConfigError, match=r"process\[1\] document_deduplicator"):
        run_worker(job, WorkerIdentity.current(), dedup_runner(DEDUP_PROCESS), SETTINGS, phases=dedup_phases(None))


def test_the_phases_of_a_recipe_without_deduplicators_are_none(tmp_path):
    build = dedup_phases(None)
    manifest = type("M", (), {"recipe": {"process": [{"copy_mapper": None}]}})()
    assert build(JobLayout(tmp_path), manifest, None, poll_secs=0.1) is None
    assert dedup_progress(JobLayout(tmp_path), manifest.recipe, 3) == []


def test_bucket_groups_grow_with_the_shards_up_to_a_cap():
    assert [dedup_phases_module.ranges_for(n) for n in (1, 7, 64, 10_000)] == [1, 7, 64, 64]


def test_rows_whose_hashing_failed_are_dropped_by_their_stage(tmp_path):
    """A row whose compute_hash raises is quarantined by the signature run (``SignatureOutput.failed``);
    the default executor drops it at that deduplicator: here its stage's drop list names it."""
    texts = [w for w in WORDS for _ in range(3)]
    failing = fake_signatures(DEDUP_PROCESS, {i for i, t in enumerate(texts) if t == "doc c"})

    job, kept, result = run_job(tmp_path, texts, 4, runner=failing)
    assert kept == dedup_oracle(["" if t == "doc c" else t for t in texts], DEDUP_PROCESS)
    lines = summary_lines(job, result, 1.0, None)
    stage = result.dedup[0]
    assert (
        f"  dedup   process[1] document_deduplicator: {stage['dropped']} of {stage['rows']} rows removed as "
        "duplicates, 3 quarantined (their hashing failed)"
    ) in lines
    assert result.dedup[0]["failed"] == 3 and result.dedup[1]["failed"] == 0
    quarantined = [json.loads(line) for line in result.quarantined.path.read_bytes().splitlines()]
    assert result.quarantined.rows == 3 and [q["row"]["text"] for q in quarantined] == ["doc c"] * 3
    reached = sum(1 for t in texts if t)
    assert result.dedup[0]["rows"] == reached
    assert result.dedup[0]["dropped"] == reached - 3 - len(
        dedup_oracle([t for t in texts if t != "doc c"], DEDUP_PROCESS[:2])
    )


# --- MinHash's path (bands, the bucket plan over several bands, the cluster step) with a fake runner ---
MINHASH_PROCESS = [{"text_length_filter": {"min_len": 1}}, {"document_minhash_deduplicator": {}}]
TOKENS = ["a", "b", "c", "d"]


def _bands(text: str) -> list[bytes]:
    """Three bands: the text's words by position (two rows sharing one join, as sharing a band value)."""
    words = (text.split() + ["", "", ""])[:3]
    return [f"{band}:{word}".encode() for band, word in enumerate(words)]


def fake_minhash(task):
    rows, bands = [], []
    for number, raw in enumerate(iter_source_lines(task.source)):
        text = json.loads(raw)["text"]
        if text:
            rows.append(number)
            bands.append(_bands(text))
    keys = minhash_keys(bands) if bands else np.empty((0, 3, 2), np.uint64)
    return SignatureOutput(np.array(rows, np.uint64), keys, "minhash", {"num_bands": 3})


def minhash_oracle(texts: list[str]) -> list[int]:
    """Data-Juicer's MinHash process: union every row sharing a band value with the first such row (the
    root the smaller row), keep the smallest row of each component, among the rows reaching it."""
    parent = {i: i for i, text in enumerate(texts) if text}

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    first: dict[bytes, int] = {}
    for i in parent:
        for value in _bands(texts[i]):
            if value in first:
                a, b = find(i), find(first[value])
                parent[max(a, b)] = min(a, b)
            else:
                first[value] = i
    return [i for i in parent if find(i) == i]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    words=st.lists(st.lists(st.sampled_from(TOKENS), min_size=0, max_size=3), min_size=1, max_size=30),
    shards=st.integers(1, 30),
)
def test_minhash_stages_keep_the_smallest_row_of_each_component(words, shards):
    texts = [" ".join(w) for w in words]
    with tempfile.TemporaryDirectory() as tmp:
        _, kept, result = run_job(Path(tmp), texts, min(shards, len(texts)), MINHASH_PROCESS, fake_minhash)
    assert kept == minhash_oracle(texts)
    assert result.dedup[0]["dropped"] == sum(1 for t in texts if t) - len(kept)


# --- SimHash's path (block bands, pairs within the distance) with a fake runner: the text is the value ---
SIMHASH_PROCESS = [{"text_length_filter": {"min_len": 1}}, {"document_simhash_deduplicator": {}}]
VALUES = [0, 1, 3, 7, 15, 0xF0, 0xF3, 1 << 40, (1 << 40) | 5, (1 << 63) | 1, (1 << 64) - 1]


def fake_simhash(task):
    rows, values = [], []
    for number, raw in enumerate(iter_source_lines(task.source)):
        text = json.loads(raw)["text"]
        if text:
            rows.append(number)
            values.append(int(text))
    keys = simhash_keys(np.array(values, np.uint64), 4, 2)
    return SignatureOutput(np.array(rows, np.uint64), keys, "simhash", {"num_blocks": 4, "distance": 2})


def simhash_oracle(texts: list[str], distance: int = 2) -> list[int]:
    """Data-Juicer's SimHash process: components of "same value or at most ``distance`` bits apart",
    the first row of each kept."""
    rows = [i for i, text in enumerate(texts) if text]
    parent = {i: i for i in rows}

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for x, i in enumerate(rows):
        for j in rows[:x]:
            if bin(int(texts[i]) ^ int(texts[j])).count("1") <= distance:
                a, b = find(i), find(j)
                parent[max(a, b)] = min(a, b)
    return [i for i in rows if find(i) == i]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(st.one_of(st.none(), st.sampled_from(VALUES)), min_size=1, max_size=30),
    shards=st.integers(1, 30),
)
def test_simhash_stages_keep_the_first_row_of_each_component(values, shards):
    texts = ["" if value is None else str(value) for value in values]
    with tempfile.TemporaryDirectory() as tmp:
        _, kept, _ = run_job(Path(tmp), texts, min(shards, len(texts)), SIMHASH_PROCESS, fake_simhash)
    assert kept == simhash_oracle(texts)


def test_an_input_another_worker_set_aside_sends_the_phases_back_without_spending_a_budget(tmp_path, monkeypatch):
    """A signature file gone while a bucket task reads (another worker found it refused and set it
    aside): the task hands its claim back unspent, the phases start over, the file's task runs again."""
    real, calls = dedup_phases_module.buckets.run_bucket, []

    def vanishing(group, readers, out, **kw):
        calls.append(out)
        if len(calls) == 1:
            readers[1].path.unlink()
        return real(group, readers, out, **kw)

    monkeypatch.setattr(dedup_phases_module.buckets, "run_bucket", vanishing)
    texts = [w for w in WORDS for _ in range(2)]
    job, kept, _ = run_job(tmp_path, texts, 3)
    assert kept == dedup_oracle(texts, DEDUP_PROCESS)
    claims = job / "dedup" / "1" / "signatures" / "claims" / "part-00001-of-00003"
    assert sorted(p.name for p in claims.iterdir()) == ["gen-000001.json", "gen-000002.json"]
    assert not list((job / "dedup" / "1" / "buckets").glob("failures/*/*")), "no bucket task spent its budget"
