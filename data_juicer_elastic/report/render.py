"""The report page: one self-contained HTML file (inline CSS and SVG, no script, no network resource).

A Content-Security-Policy of ``default-src 'none'`` makes the browser itself refuse
anything that would be fetched, so a later change that adds an external resource
shows up as a console error in the Chromium test instead of a silent dependency.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from data_juicer_elastic import __version__
from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.jobdir.shard_state import ShardState
from data_juicer_elastic.report import charts, series
from data_juicer_elastic.report import svg as s
from data_juicer_elastic.status.job_history import AttemptOutcome, JobFacts, read_history
from data_juicer_elastic.status.job_times import format_wall, utc_stamp
from data_juicer_elastic.status.run_status import run_state

MAX_TABLE_ROWS: Final = 200
MAX_INPUT_ROWS: Final = 50
CSP: Final = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

CSS: Final = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1140px;padding:16px;color:#222}
h1{font-size:22px;margin:8px 0}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.muted{color:#666}.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:130px}
.card b{display:block;font-size:19px}.bad{color:#c62828}.ok{color:#2e7d32}
table{border-collapse:collapse;margin:6px 0;font-size:13px}td,th{border-bottom:1px solid #eee;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#fafafa}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:12px;word-break:break-all}.chart{display:block;margin:4px 0}.note{color:#555;font-size:13px}
"""


@dataclass(frozen=True)
class ReportResult:
    output: Path
    bytes: int
    shards: int
    attempts: int
    aggregated: bool  # the timeline shows activity strips instead of one bar per attempt
    facts: JobFacts


def write_report(job_dir: str | Path, output: str | Path, now: float | None = None) -> ReportResult:
    """Write the report of ``job_dir`` to ``output`` (replaced atomically); the job is only read."""
    job = Path(os.path.abspath(job_dir))
    target = Path(os.path.abspath(output))
    if target == job or job in target.parents:
        raise ConfigError(
            f"the report {target} would be written inside the job directory {job}",
            where="--output",
            hint="write the report elsewhere: dj-elastic report never changes the job directory",
        )
    facts = read_history(job, now=now)
    data = page(facts).encode("utf-8")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    # 0o666 minus the umask, like any file the user writes (mkstemp's 0600 would hide a report meant to be shared)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)  # a reader never sees half a report
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return ReportResult(
        target, len(data), len(facts.shards), len(facts.attempts), len(facts.attempts) > charts.MAX_BARS, facts
    )


def page(facts: JobFacts) -> str:
    m = facts.manifest
    win = series.window(facts.attempts, facts.taken_at)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>dj-elastic report: {s.esc(m.job_id)}</title><style>{CSS}</style></head><body>",
        f"<h1>dj-elastic report: job <code>{s.esc(m.job_id)}</code></h1>",
        f'<p class="muted">{s.esc(facts.job_dir)} &middot; taken {utc_stamp(facts.taken_at)} by data-juicer-elastic '
        f"{s.esc(__version__)} (a read-only snapshot; re-run <code>dj-elastic report</code> to refresh)</p>",
        _summary(facts, win),
    ]
    parts.append('<h2 id="timeline">Timeline of attempts per node</h2>')
    if win is None:
        parts.append("<p>No attempt has started yet.</p>")
    else:
        svg, note = charts.timeline_svg(facts.attempts, win, facts.taken_at)
        parts += [f'<p class="note">{s.esc(note)}</p>', svg]
        parts.append('<h2 id="throughput">Throughput over time</h2>')
        parts.append(
            '<p class="note">Input rows per second: each accepted shard result spread evenly over its attempt, '
            "and the rows running attempts have read so far (their live progress records).</p>"
        )
        parts += [charts.throughput_svg(facts.attempts, win), charts.progress_svg(facts.attempts, win, m.total_rows)]
        parts.append('<h2 id="scatter">Shard size vs duration</h2>')
        svg, note = charts.scatter_svg(facts.attempts, win.t0)
        parts += [f'<p class="note">{s.esc(note)}</p>', svg]
    parts += _batching(facts)
    parts += _attention(facts)
    parts += _nodes(facts)
    parts += _manifest(facts)
    parts += _runs(facts)
    if facts.warnings:
        parts.append('<h2 id="warnings">Unreadable records</h2><ul>')
        parts += [f"<li><code>{s.esc(w)}</code></li>" for w in facts.warnings]
        parts.append("</ul>")
    parts.append(
        '<p class="muted">Times are the wall clocks of the workers that wrote the records; '
        "they are informational (the job never compares clocks across nodes).</p></body></html>"
    )
    return "\n".join(parts)


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: set[int] = frozenset(), cls: str = ""
) -> str:
    out = [f'<table class="{cls}"><tr>' + "".join(f"<th>{s.esc(h)}</th>" for h in headers) + "</tr>"]
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            text = "" if value is None else (f"{value:,}" if isinstance(value, int) and i in numeric else str(value))
            cells.append(f'<td class="n">{s.esc(text)}</td>' if i in numeric else f"<td>{s.esc(text)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _card(label: str, value: str, cls: str = "") -> str:
    return f'<div class="card"><b class="{cls}">{s.esc(value)}</b>{s.esc(label)}</div>'


def _summary(facts: JobFacts, win: series.Window | None) -> str:
    counts = facts.counts
    total = len(facts.shards)
    rows_done = facts.view.snapshot.rows_done
    if counts[ShardState.DONE] == total:
        state, cls = "complete", "ok"
    elif counts[ShardState.FAILED]:
        state, cls = f"{counts[ShardState.FAILED]} shard(s) FAILED", "bad"
    elif counts[ShardState.RUNNING] or counts[ShardState.STALE]:
        state, cls = "running", ""
    else:
        state, cls = "incomplete", ""
    attempts = facts.attempts
    retried = facts.view.throughput.retried  # as status counts them: shards with a failure record
    nodes = len({a.node_id for a in attempts})
    accepted = [a for a in attempts if a.outcome is AttemptOutcome.DONE and a.quarantined]
    quarantined, shards_q = sum(a.quarantined or 0 for a in accepted), len(accepted)
    cards = [
        _card("job state", state, cls),
        _card("shards done", f"{counts[ShardState.DONE]:,} / {total:,}"),
        _card("input rows done", f"{rows_done:,} / {facts.manifest.total_rows:,}"),
        _card("running / stale", f"{counts[ShardState.RUNNING]:,} / {counts[ShardState.STALE]:,}"),
        _card("attempts", f"{len(attempts):,}"),
        _card(
            "failed / lost attempts",
            f"{_n(attempts, AttemptOutcome.FAILED):,} / {_n(attempts, AttemptOutcome.LOST):,}",
            "bad" if _n(attempts, AttemptOutcome.FAILED) + _n(attempts, AttemptOutcome.LOST) else "",
        ),
        _card("shards retried", f"{retried:,}"),
        _card(
            "rows quarantined",
            f"{quarantined:,}" + (f" in {shards_q:,} shard(s)" if quarantined else ""),
            "bad" if quarantined else "",
        ),
        _card("nodes", f"{nodes:,}"),
    ]
    times = facts.view.times
    if times is not None:  # the run's own times, as the closing summary and `status` give them
        ended = times.finalized_at is not None
        cards.append(_card("wall time" if ended else "wall time so far", format_wall(times.wall_secs(facts.taken_at))))
    elif win is not None:
        cards.append(_card("wall time" if state == "complete" else "wall time so far", format_wall(win.span)))
    if win is not None:
        cards.append(_card("mean input rows/s", f"{rows_done / win.span:,.1f}"))
    numbers = facts.view.throughput
    if state != "complete" and numbers.rows_per_sec:  # as `status` gives them: the running attempts' rates
        cards.append(_card("input rows/s now", f"{numbers.rows_per_sec:,.1f}"))
        eta = numbers.eta_secs
        cards.append(_card("time left (ETA)", format_wall(eta) if eta is not None else "unknown"))
    cards += _scan_cards(facts)
    cards += _dedup_cards(facts)
    return '<div class="cards">' + "".join(cards) + "</div>"


def _dedup_cards(facts: JobFacts) -> list[str]:
    """One card per deduplicator, as ``status`` names it (``dedup.phase_progress``): once decided the
    rows it removed of those that reached it, before that its phase and the phase's tasks published."""
    cards = []
    for stage in facts.view.dedup:
        label = f"dedup {stage.stage}/{stage.stages} {stage.op} (process[{stage.position}])"
        if stage.phase == "done":
            value = f"{stage.dropped:,} of {stage.rows:,} rows removed"
            value += f", {stage.failed:,} quarantined (their hashing failed)" if stage.failed else ""
        else:
            value = f"{stage.phase} {stage.done}/{'?' if stage.total is None else stage.total}"
        cards.append(_card(label, value))
    return cards


def _scan_cards(facts: JobFacts) -> list[str]:
    """The scan phase (every shard read and checked before the first one runs), and from the
    submission to the first shard running and to the last one done (``status.job_times``)."""
    phase = facts.view.snapshot.scan
    cards = []
    if phase is not None:
        rate = f"{(phase.bytes_per_sec or 0) / 1e6:,.1f} MB/s in {format_wall(phase.secs or 0)}"  # as status says
        cards.append(_card("scan (every shard checked)", rate))
    times = facts.view.times
    if times is not None and (first := times.first_shard_secs()) is not None:
        cards.append(_card("first shard running after submission", format_wall(first)))
    if times is not None and (last := times.last_shard_secs()) is not None:
        cards.append(_card("last shard done after submission", format_wall(last)))
    return cards


def _n(attempts, outcome: AttemptOutcome) -> int:
    return sum(1 for a in attempts if a.outcome is outcome)


def _batching(facts: JobFacts) -> list[str]:
    out = ['<h2 id="batching">Adaptive batching</h2>']
    used = [a for a in facts.attempts if a.batching]
    if not used and not facts.traces:
        return out + ["<p>No attempt of this job used adaptive batching (no size traces recorded).</p>"]
    ooms = sum(int(a.batching.get("ooms") or 0) for a in used)
    out.append(
        f'<p class="note">{len(used):,} attempt(s) used adaptive batching and recovered {ooms:,} out-of-memory '
        "error(s). Each chart shows the micro-batch sizes of the most recent calls of each process.</p>"
    )
    for stage, svg in charts.batching_svgs(facts.traces):
        out += [f"<h3><code>{s.esc(stage)}</code></h3>", svg]
    if facts.traces_skipped:
        out.append(f'<p class="note">{facts.traces_skipped:,} more trace files were not read (bounded).</p>')
    rows = []
    for attempt in sorted(used, key=lambda a: (-int(a.batching.get("ooms") or 0), a.shard_index))[:MAX_TABLE_ROWS]:
        for stage, info in sorted((attempt.batching.get("stages") or {}).items()):
            counts = (info.get(key) for key in ("ooms", "retries", "first_rows", "final_rows", "min_rows", "max_rows"))
            rows.append(
                (attempt.shard_id, attempt.ordinal, stage, *counts, ", ".join(info.get("seeded_from") or []) or "-")
            )
    headers = ("shard", "attempt", "stage", "OOMs", "retries", "first rows", "final rows", "min", "max", "seeded from")
    out.append(_table(headers, rows, {1, 3, 4, 5, 6, 7, 8}, "batching"))
    return out


def _attention(facts: JobFacts) -> list[str]:
    out = ['<h2 id="attention">Shards needing attention</h2>']
    by_shard: dict[str, list] = {}
    for attempt in facts.attempts:
        by_shard.setdefault(attempt.shard_id, []).append(attempt)
    order = {ShardState.FAILED: 0, ShardState.STALE: 1, ShardState.RUNNING: 2}
    index = {shard.shard_id: i for i, shard in enumerate(facts.shards)}
    picked = [sh for sh in facts.shards if sh.state in order or len(by_shard.get(sh.shard_id, ())) > 1]
    picked.sort(key=lambda sh: (order.get(sh.state, 3), index[sh.shard_id]))
    if not picked:
        return out + ["<p>None: every shard that ran succeeded on its first attempt.</p>"]
    rows = []
    for shard in picked[:MAX_TABLE_ROWS]:
        mine = by_shard.get(shard.shard_id, [])
        trail = " → ".join(f"{charts.attempt_category(a)}@{a.node_id}" for a in mine)
        # a done shard's failures are not read from the summary: its attempts' errors are
        error = shard.last_error or next((a.error for a in reversed(mine) if a.error), "")
        rows.append((shard.shard_id, shard.state.value, len(mine), trail, error[-300:]))
    out.append(_table(("shard", "state", "attempts", "attempts (outcome@node)", "last error"), rows, {2}, "attention"))
    if len(picked) > MAX_TABLE_ROWS:
        out.append(f'<p class="note">... and {len(picked) - MAX_TABLE_ROWS:,} more (see dj-elastic status --all).</p>')
    return out


def _nodes(facts: JobFacts) -> list[str]:
    summaries = series.node_summaries(facts.attempts, facts.taken_at)
    if not summaries:
        return []
    rates = sorted(r for n in summaries if (r := n.rows_per_sec) is not None)
    median = rates[len(rates) // 2] if rates else None
    rows = []
    for node in sorted(summaries, key=lambda n: n.rows_per_sec or 0.0)[:MAX_TABLE_ROWS]:
        rate = node.rows_per_sec
        versus = f"{rate / median:.2f}x" if rate and median else "-"
        counts = (node.attempts, node.done, node.failed, node.lost, node.running, node.rows_done)
        rows.append((node.node_id, *counts, format_wall(node.busy_secs), f"{rate:,.1f}" if rate else "-", versus))
    headers = (
        "node",
        "attempts",
        "done",
        "failed",
        "lost",
        "running",
        "input rows done",
        "busy",
        "rows/s",
        "vs median",
    )
    out = ['<h2 id="nodes">Nodes (slowest first)</h2>', _table(headers, rows, {1, 2, 3, 4, 5, 6, 8, 9}, "nodes")]
    if len(summaries) > MAX_TABLE_ROWS:
        out.append(f'<p class="note">... and {len(summaries) - MAX_TABLE_ROWS:,} more nodes.</p>')
    return out


def _manifest(facts: JobFacts) -> list[str]:
    m = facts.manifest
    out = ['<h2 id="manifest">Manifest</h2>']
    out.append(
        _table(
            ("field", "value"),
            [
                ("job id", m.job_id),
                ("prepared", utc_stamp(m.created_at)),
                ("dataset", f"{m.dataset_path} ({m.dataset_kind}, {len(m.inputs):,} file(s))"),
                ("rows / bytes", f"{m.total_rows:,} rows, {s.fmt_bytes(m.total_bytes)} in {m.num_shards:,} shards"),
                ("content sha256", m.content_sha256),
                ("recipe hash", m.recipe_hash),
                ("index key", m.index_key or "-"),
                ("media keys", ", ".join(f"{k}={v}" for k, v in sorted(m.media_keys.items())) or "-"),
            ],
            cls="manifest",
        )
    )
    out.append("<h3>Inputs</h3>")
    rows = [
        (f.relpath, f.rows, s.fmt_bytes(f.size), f.sha256[:16] + "…" if f.sha256 else "per shard")
        for f in m.inputs[:MAX_INPUT_ROWS]
    ]
    out.append(_table(("file", "rows", "size", "sha256"), rows, {1}, "inputs"))
    if len(m.inputs) > MAX_INPUT_ROWS:
        out.append(f'<p class="note">... and {len(m.inputs) - MAX_INPUT_ROWS:,} more input files.</p>')
    out.append("<h3>Stage identities</h3>")
    process = m.recipe.get("process") if isinstance(m.recipe.get("process"), list) else []
    ops = [next(iter(op)) if isinstance(op, dict) and op else str(op) for op in process]
    named = len(ops) == len(m.stage_identities)
    out.append(
        _table(
            ("#", "operator", "stage identity"),
            [(i, ops[i] if named else "", stage) for i, stage in enumerate(m.stage_identities)],
            {0},
            "stages",
        )
    )
    out.append("<h3>Versions and settings</h3>")
    settings = [(f"version: {k}", v) for k, v in sorted(m.versions.items())]
    settings += [(f"ray: {k}", v) for k, v in sorted(m.ray.items())]
    settings += [(f"elastic: {k}", v) for k, v in sorted(m.settings.items())]
    out.append(_table(("name", "value"), settings, cls="versions"))
    if facts.merge is not None:
        mr = facts.merge
        out.append(
            f"<p>Merged {mr.rows:,} rows ({s.fmt_bytes(mr.bytes)}) into <code>{s.esc(mr.output_path)}</code> at "
            f"{utc_stamp(mr.merged_at)}; sha256 <code>{s.esc(mr.sha256)}</code>.</p>"
        )
        if mr.errors_rows:
            out.append(
                f"<p>Quarantined {mr.errors_rows:,} rows (operators failed on them) into "
                f"<code>{s.esc(mr.errors_path or '')}</code>, each with its error.</p>"
            )
    return out


def _runs(facts: JobFacts) -> list[str]:
    if not facts.view.runs:
        return []
    rows = []
    for run in facts.view.runs[:MAX_TABLE_ROWS]:
        state = run_state(run)
        nodes = sorted({p["node_id"] for p in run.get("participants", [])})
        rows.append((run.get("run_id"), run.get("source"), state, len(run.get("participants", [])), ", ".join(nodes)))
    return [
        '<h2 id="runs">Runs (submissions)</h2>',
        _table(("run id", "source", "outcome", "instances", "nodes"), rows, {3}, "runs"),
    ]
