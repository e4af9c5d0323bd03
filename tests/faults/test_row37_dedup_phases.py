"""Matrix row 37: deduplication across shards, its phases on the task queue (``dedup.phases``).

The fault driver's real worker loop, lease code and phase files, with a fake signature runner (exact dedup:
the md5 of each row's text computed in Python, as ``document_deduplicator`` does) and a fake shard runner
that applies the drop lists.  The oracle is a plain Python pass over the input: each deduplicator keeps
the first row of each hash among the rows reaching it (``fakes.dedup_oracle``), as Data-Juicer's
default executor does.  The recipe (``fakes.DEDUP_PROCESS``): a filter, then two exact deduplicators.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest

from .conftest import dj_elastic_status, run_driver, start_driver, summary_of
from .fakes import DEDUP_PROCESS, dedup_oracle, dedup_texts, prepare

ROWS = 40


def expected_bytes(rows: int = ROWS) -> bytes:
    texts = dedup_texts(rows)
    kept = dedup_oracle(texts, DEDUP_PROCESS)
    return b"".join(json.dumps({"id": i, "text": texts[i]}, separators=(",", ":")).encode() + b"\n" for i in kept)


def merged(job, tmp_path, name="merged.jsonl") -> bytes:
    out = tmp_path / name
    proc = run_driver("merge", job, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out.read_bytes()


def worker(job, *args, **kw):
    return run_driver("worker", job, "--dedup", *args, **kw)


def finished_job(tmp_path, shards=4, name="job"):
    job = prepare(tmp_path, ROWS, shards, name=name, process=DEDUP_PROCESS)
    proc = worker(job)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return job


def test_the_oracle_keeps_and_drops_rows_in_both_stages():
    texts = dedup_texts(ROWS)
    first = dedup_oracle(texts, DEDUP_PROCESS[:2])
    both = dedup_oracle(texts, DEDUP_PROCESS)
    assert len(both) < len(first) < len([t for t in texts if t]) < ROWS


@pytest.mark.parametrize("shards", [1, 2, 7, ROWS])
def test_the_job_keeps_exactly_the_rows_of_the_default_executor(tmp_path, shards):
    """`dj-process`'s coordinated run (elections, phases, shards, merge) with the fake runners: the rows
    of the oracle, in input order, the same bytes for every num_shards (one row per shard included)."""
    data = tmp_path / "input.jsonl"
    prepare(tmp_path, ROWS, 1, name="unused", process=DEDUP_PROCESS)  # writes <name>-input.jsonl
    shutil.copy(tmp_path / "unused-input.jsonl", data)
    out = tmp_path / "out.jsonl"
    proc = run_driver("run", tmp_path / "job", data, out, "--run-id", "r1", "--shards", str(shards), "--dedup")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_bytes() == expected_bytes()
    marker = json.loads((tmp_path / "job" / "dedup" / "1" / "cluster.json").read_bytes())
    assert marker["rows"] == sum(1 for t in dedup_texts(ROWS) if t) and len(marker["per_shard"]) == shards


# (crash point, what was published before the kill)
PHASE_KILLS = [
    ("link:.sig", "signatures"),  # before the first signature file is linked
    ("link:.sig@3", "signatures"),  # some published, one held
    ("link:plan.json", "bucket plan"),
    ("link:.edges", "buckets"),
    ("link:.drops", "cluster"),
    ("link:cluster.json", "cluster marker"),
    ("link:/dedup/2/signatures/part-00001", "stage 2 signatures"),
]


# the default tier kills once in each phase; the extended tier at the other points too
EXTENDED_KILLS = {"link:.sig@3", "link:cluster.json", "link:/dedup/2/signatures/part-00001"}


@pytest.mark.parametrize(
    "point",
    [pytest.param(p, id=w, marks=[pytest.mark.extended] if p in EXTENDED_KILLS else []) for p, w in PHASE_KILLS],
)
def test_a_worker_killed_in_any_phase_then_rerun_gives_the_same_bytes(tmp_path, point):
    job = prepare(tmp_path, ROWS, 4, process=DEDUP_PROCESS)
    victim = worker(job, node="victim", crash=point)
    assert victim.returncode == -signal.SIGKILL, victim.stderr[-3000:]
    assert not (job / "done").exists() or not list((job / "done").iterdir()), "no shard ran before the phases"
    rescuer = worker(job, node="rescuer")
    assert rescuer.returncode == 0, rescuer.stderr[-3000:]
    assert merged(job, tmp_path) == expected_bytes()
    again = worker(job, node="again")  # a rerun reuses every published phase file and runs nothing
    assert again.returncode == 0 and summary_of(again)["claimed"] == 0
    assert "claimed" not in again.stderr.replace("claimed 0", ""), again.stderr[-3000:]


def _flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-5])


def _largest(paths):
    return max(paths, key=lambda p: p.stat().st_size)


# (crash point that leaves the files to damage published, the files, how)
DAMAGE = [
    ("link:plan.json", "dedup/1/signatures/*.sig", _flip_last_byte),
    ("link:plan.json", "dedup/1/signatures/*.sig", _truncate),
    ("link:.drops", "dedup/1/edges/*.edges", _flip_last_byte),
    ("link:.drops", "dedup/1/edges/*.edges", _truncate),
    ("link:/done/", "dedup/1/drops/part-00003-of-00004.drops", _flip_last_byte),
    ("link:/done/", "dedup/1/drops/part-00003-of-00004.drops", _truncate),
    ("link:/done/", "dedup/1/buckets/plan.json", _truncate),
    ("link:/done/", "dedup/2/cluster.json", _flip_last_byte),
]


@pytest.mark.parametrize(
    "point, pattern, damage",
    [
        pytest.param(
            point, pattern, damage, id=f"{pattern.split('/')[-1].split('.')[-1]}-{damage.__name__[1:]}",
            marks=[pytest.mark.extended] if damage is _truncate and not pattern.endswith("plan.json") else [],
        )
        for point, pattern, damage in DAMAGE
    ],
)  # fmt: skip
def test_a_tampered_or_truncated_phase_file_is_refused_and_recomputed(tmp_path, point, pattern, damage):
    job = prepare(tmp_path, ROWS, 4, process=DEDUP_PROCESS)
    assert worker(job, crash=point).returncode == -signal.SIGKILL
    target = _largest(list(job.glob(pattern)))
    damage(target)
    rescuer = worker(job, node="rescuer")
    assert rescuer.returncode == 0, rescuer.stderr[-3000:]
    assert "refused" in rescuer.stderr or "running it again" in rescuer.stderr or "recomputing" in rescuer.stderr
    assert merged(job, tmp_path) == expected_bytes()


def test_phase_files_left_by_a_different_recipe_are_recomputed(tmp_path):
    other_process = [{"text_length_filter": {"min_len": 2}}, *DEDUP_PROCESS[1:]]
    other = prepare(tmp_path, ROWS, 4, name="other", process=other_process)
    assert worker(other).returncode == 0  # the other recipe's phases (the driver runs DEDUP_PROCESS's fakes)
    job = prepare(tmp_path, ROWS, 4, process=DEDUP_PROCESS)
    copied = 0
    for path in (other / "dedup").rglob("*"):
        if path.suffix in (".sig", ".edges", ".drops") or path.name in ("plan.json", "cluster.json"):
            target = job / path.relative_to(other)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
            copied += 1
    assert copied > 10
    proc = worker(job)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "different recipe" in proc.stderr
    assert merged(job, tmp_path) == expected_bytes()
    marker = json.loads((job / "dedup" / "1" / "cluster.json").read_bytes())
    assert marker["identity"].startswith(json.loads((job / "manifest.json").read_bytes())["recipe_hash"])


def test_two_workers_at_once_keep_the_oracles_rows(tmp_path):
    job = prepare(tmp_path, ROWS, 7, process=DEDUP_PROCESS)
    procs = [start_driver("worker", job, "--dedup", node=f"w{i}") for i in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
    assert merged(job, tmp_path) == expected_bytes()
    # every phase task ran once: one claim generation each, nobody took one over
    for claims in (job / "dedup").glob("*/*/claims/*"):
        assert [p.name for p in claims.iterdir()] == ["gen-000001.json"], claims


def test_a_worker_that_does_not_wait_stops_while_another_holds_a_phase(tmp_path):
    job = prepare(tmp_path, ROWS, 1, process=DEDUP_PROCESS)
    slow = [{"op": "link", "path": ".sig", "mode": "delay", "delay_secs": 6}]
    holder = start_driver("worker", job, "--dedup", node="holder", faults=slow)
    claim = job / "dedup" / "1" / "signatures" / "claims" / "part-00000-of-00001" / "gen-000001.json"
    deadline = time.monotonic() + 60
    while not claim.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert claim.exists()
    late = worker(job, "--no-wait", node="late")
    assert late.returncode == 0, late.stderr[-3000:]
    assert summary_of(late)["stop_reason"] == "no_work" and summary_of(late)["claimed"] == 0
    out, err = holder.communicate(timeout=120)
    assert holder.returncode == 0, err[-3000:]
    assert merged(job, tmp_path) == expected_bytes()


def test_status_names_each_deduplicators_phase_and_what_it_dropped(tmp_path):
    job = prepare(tmp_path, ROWS, 4, process=DEDUP_PROCESS)
    assert worker(job, crash="link:.edges@2").returncode == -signal.SIGKILL  # one bucket group published
    text = dj_elastic_status(job)
    assert "dedup 1/2 document_deduplicator: buckets 1/4" in text.stdout, text.stdout
    assert "dedup 2/2 document_deduplicator: signatures 0/4" in text.stdout
    stages = json.loads(dj_elastic_status(job, "--json").stdout)["dedup"]
    assert [(s["phase"], s["done"], s["total"]) for s in stages] == [("buckets", 1, 4), ("signatures", 0, 4)]
    assert worker(job).returncode == 0
    stages = json.loads(dj_elastic_status(job, "--json").stdout)["dedup"]
    texts = dedup_texts(ROWS)
    reached = [t for t in texts if t]
    first = dedup_oracle(texts, DEDUP_PROCESS[:2])
    assert [(s["phase"], s["rows"], s["dropped"]) for s in stages] == [
        ("done", len(reached), len(reached) - len(first)),
        ("done", len(first), len(first) - len(dedup_oracle(texts, DEDUP_PROCESS))),
    ]
    assert f"dedup 1/2 document_deduplicator: done, {len(reached) - len(first)} of {len(reached)} rows dropped" in (
        dj_elastic_status(job).stdout
    )
    assert merged(job, tmp_path) == expected_bytes()
    record = json.loads((job / "merge.json").read_bytes())
    assert [(s["op"], s["position"], s["rows"], s["dropped"]) for s in record["dedup"]] == [
        ("document_deduplicator", 1, len(reached), len(reached) - len(first)),
        ("document_deduplicator", 2, len(first), stages[1]["dropped"]),
    ]


@pytest.mark.slow
def test_a_holder_paused_past_the_ttl_is_taken_over_and_abandons_when_resumed(tmp_path):
    """A signature task's holder SIGSTOPped before its runner (opening its attempt) is taken over as stale
    after the TTL; resumed, it finds its lease lost at the fence, publishes nothing and abandons."""
    job = prepare(tmp_path, ROWS, 2, process=DEDUP_PROCESS)
    lease = ["--ttl", "2", "--heartbeat", "0.5"]
    paths = ["/dedup/1/signatures/attempts/", "attempt.json"]
    slow = [{"op": "replace", "path": paths, "mode": "delay", "delay_secs": 3, "times": 1}]
    zombie = start_driver("worker", job, "--dedup", *lease, node="zombie", faults=slow)
    attempts = job / "dedup" / "1" / "signatures" / "attempts" / "part-00000-of-00002"
    deadline = time.monotonic() + 60
    while not attempts.exists():
        assert zombie.poll() is None and time.monotonic() < deadline, zombie.communicate()[1][-3000:]
        time.sleep(0.02)
    os.kill(zombie.pid, signal.SIGSTOP)
    try:
        rescuer = worker(job, *lease, node="rescuer")
        assert rescuer.returncode == 0, rescuer.stderr[-3000:]
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    out, err = zombie.communicate(timeout=120)
    assert zombie.returncode == 0, err[-3000:]
    assert "abandoning attempt" in err, err[-3000:]
    claims = job / "dedup" / "1" / "signatures" / "claims" / "part-00000-of-00002"
    taken = json.loads((claims / "gen-000002.json").read_bytes())
    assert taken["node_id"] == "rescuer" and taken["takeover_reason"] == "stale"
    assert merged(job, tmp_path) == expected_bytes()


HASH_FAILS = (3, 17, 22)  # rows that reach the first deduplicator (non-empty texts) and whose hashing raises


def test_rows_whose_hashing_raised_are_quarantined_in_the_export_in_input_order(tmp_path):
    """The fake signature runner fails the hashing of three rows (two in one shard): they are left out of the
    output as the default executor leaves them (dropped at that stage), and their quarantine lines reach
    `<export>_errors.jsonl` in input order and the merge's quarantined count; a tampered quarantine file
    of a signature attempt is refused by the merge."""
    texts = dedup_texts(ROWS)
    assert all(texts[i] for i in HASH_FAILS)
    job = prepare(tmp_path, ROWS, 4, process=DEDUP_PROCESS)
    proc = worker(job, "--hash-fails", ",".join(map(str, HASH_FAILS)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    marker = json.loads((job / "dedup" / "1" / "cluster.json").read_bytes())
    assert marker["failed"] == len(HASH_FAILS)
    without = ["" if i in HASH_FAILS else t for i, t in enumerate(texts)]  # gone before the first deduplicator
    kept = dedup_oracle(without, DEDUP_PROCESS)
    expected = b"".join(json.dumps({"id": i, "text": texts[i]}, separators=(",", ":")).encode() + b"\n" for i in kept)
    assert merged(job, tmp_path) == expected
    errors = tmp_path / "merged_errors.jsonl"
    lines = [json.loads(line) for line in errors.read_bytes().splitlines()]
    assert [(r["row_number"], r["op"], r["row"]) for r in lines] == [
        (i, "elastic_dedup_hash", {"id": i, "text": texts[i]}) for i in HASH_FAILS
    ]
    record = json.loads((job / "merge.json").read_bytes())
    assert record["errors_rows"] == len(HASH_FAILS) and record["dedup"][0]["failed"] == len(HASH_FAILS)
    stages = json.loads(dj_elastic_status(job, "--json").stdout)["dedup"]
    assert [s["failed"] for s in stages] == [len(HASH_FAILS), 0]
    assert f"rows dropped, {len(HASH_FAILS)} quarantined (their hashing failed)" in dj_elastic_status(job).stdout

    found = job.glob("dedup/1/signatures/attempts/*/*/errors.jsonl")
    (quarantine,) = [p for p in found if b'"row_number":17' in p.read_bytes()]
    quarantine.write_bytes(quarantine.read_bytes().replace(b'"row_number":17', b'"row_number":71'))
    refused = run_driver("merge", job, tmp_path / "again.jsonl")
    assert refused.returncode == 2 and "does not match its record" in refused.stderr, refused.stderr[-2000:]
