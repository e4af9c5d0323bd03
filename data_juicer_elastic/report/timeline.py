"""The per-node timeline of attempts (Gantt-style): one bar per attempt while that stays readable,
else one activity strip per node with every failed or lost attempt still marked individually."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from data_juicer_elastic.report import palette, series
from data_juicer_elastic.report import svg as s
from data_juicer_elastic.report.attempt_facts import AttemptFact, AttemptOutcome
from data_juicer_elastic.status.job_times import format_wall

MAX_BARS: Final = 2000  # above this many attempts, nodes are drawn as activity strips
MAX_NODES: Final = 48  # node rows; the rest share one "other" row
MAX_SLOT_LANES: Final = 8  # concurrent attempts drawn side by side on one node
MAX_MARKS: Final = 2000  # failed/lost attempts marked individually on activity strips
BUCKETS: Final = 240
LEVELS: Final = 8
LEFT: Final = 150
LANE: Final = 16
GAP: Final = 6


def utc_stamp(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def attempt_hover_text(attempt: AttemptFact, t0: float, now: float) -> str:
    """The hover text of one attempt."""
    end = attempt.end_or(now)
    lines = [
        f"{attempt.shard_id} attempt {attempt.ordinal} (generation {attempt.generation})",
        f"node {attempt.node_id} ({attempt.hostname}, pid {attempt.pid})",
        f"{format_wall(attempt.started_at - t0)} to {format_wall(end - t0)} "
        f"({format_wall(end - attempt.started_at)}), started {utc_stamp(attempt.started_at)}",
        f"{palette.category(attempt)} [{attempt.detail}]: {attempt.input_rows} input rows"
        + (f", {attempt.output_rows} output rows" if attempt.output_rows is not None else "")
        + (f", {attempt.quarantined} quarantined" if attempt.quarantined else ""),
    ]
    if attempt.end_estimated:
        lines.append("end not recorded (worker died?): last heartbeat or failure time shown")
    if attempt.outcome is AttemptOutcome.RUNNING and attempt.heartbeat_age_secs is not None:
        lines.append(f"heartbeat {format_wall(attempt.heartbeat_age_secs)} ago")
    if attempt.progress:
        lines.append(f"progress: {attempt.progress[-1][1]} of {attempt.input_rows} input rows read, {attempt.stage}")
    if attempt.error:
        lines.append(f"error: {attempt.error[-300:]}")
    batching = attempt.batching or {}
    if batching.get("ooms"):
        lines.append(f"adaptive batching: {batching['ooms']} OOM(s) recovered")
    return "\n".join(lines)


def _node_rows(attempts: Sequence[AttemptFact]) -> list[tuple[str, list[AttemptFact]]]:
    grouped: dict[str, list[AttemptFact]] = defaultdict(list)
    for attempt in attempts:
        grouped[attempt.node_id].append(attempt)
    if len(grouped) <= MAX_NODES:
        return sorted(grouped.items())

    def trouble(node: str) -> tuple:
        mine = grouped[node]
        bad = sum(a.outcome in (AttemptOutcome.FAILED, AttemptOutcome.LOST, AttemptOutcome.RUNNING) for a in mine)
        return (-bad, -len(mine), node)

    keep = sorted(sorted(grouped, key=trouble)[: MAX_NODES - 1])
    rest = [a for node, mine in grouped.items() if node not in keep for a in mine]
    others = len(grouped) - len(keep)
    return [(node, grouped[node]) for node in keep] + [(f"other ({others} nodes)", rest)]


def timeline_svg(attempts: Sequence[AttemptFact], win: series.Window, now: float) -> tuple[str, str]:
    """(SVG, a sentence saying how it is drawn)."""
    rows = _node_rows(attempts)
    aggregated = len(attempts) > MAX_BARS
    scale = s.Scale(win.t0, win.t1, LEFT, s.CHART_WIDTH - s.CHART_RIGHT)
    legend, legend_h = s.legend(palette.legend_items(), LEFT, 14, s.CHART_WIDTH - LEFT - s.CHART_RIGHT)
    top = 14 + legend_h
    body: list[str] = []
    y = top
    for node, mine in rows:
        if aggregated:
            height = _strip(body, node, mine, win, scale, y, now)
        else:
            height = _bars(body, mine, scale, y, win.t0, now)
        body.append(
            f'<text x="{LEFT - 6}" y="{s.num(y + LANE - 2)}" text-anchor="end">{s.title(node)}{s.esc(node[:24])}</text>'
        )
        body.append(
            f'<line x1="{LEFT}" y1="{s.num(y + height + GAP / 2)}" x2="{s.CHART_WIDTH - s.CHART_RIGHT}" '
            f'y2="{s.num(y + height + GAP / 2)}" stroke="#f0f0f0"/>'
        )
        y += height + GAP
    axis_y = y + 4
    out = [s.svg_open(s.CHART_WIDTH, axis_y + 40, "timeline of attempts per node"), *legend]
    out += s.x_axis(scale, [win.t0 + t for t in s.time_ticks(win.span)], axis_y, top, lambda t: format_wall(t - win.t0))
    out += body
    if any(a.outcome is AttemptOutcome.RUNNING for a in attempts):
        x = s.num(scale(now))
        out.append(f'<line x1="{x}" y1="{top}" x2="{x}" y2="{s.num(axis_y)}" stroke="#1e88e5" stroke-dasharray="4 3"/>')
        out.append(s.text(scale(now), top - 2, "now", "end", ' fill="#1e88e5"'))
    out.append(s.text(LEFT, axis_y + 32, f"elapsed since the first attempt started ({utc_stamp(win.t0)})"))
    out.append("</svg>")
    if aggregated:
        note = (
            f"{len(attempts):,} attempts are too many to draw one by one: each node row shows how many of its "
            f"attempts ran at once (darker = more), in {BUCKETS} time buckets; failed and lost attempts are "
            "marked individually (red/orange ticks). Hover for details."
        )
    else:
        note = "One bar per attempt; concurrent attempts on one node (slots) are stacked. Hover a bar for details."
    if len(rows) and rows[-1][0].startswith("other (") and len(rows) == MAX_NODES:
        note += f" The {MAX_NODES - 1} nodes with the most failures and attempts have their own row."
    return "".join(out), note


def _bars(out: list[str], mine: list[AttemptFact], scale: s.Scale, y: float, t0: float, now: float) -> float:
    intervals = [(a.started_at, a.end_or(now)) for a in mine]
    lanes, used = series.pack_lanes(intervals, MAX_SLOT_LANES)
    for attempt, lane, (start, end) in zip(mine, lanes, intervals, strict=True):
        x0, x1 = scale(start), scale(end)
        category = palette.category(attempt).replace(" ", "-")
        dash = ' stroke-dasharray="3 2"' if attempt.end_estimated else ""
        out.append(
            f'<rect class="bar bar-{category}" x="{s.num(x0)}" y="{s.num(y + lane * (LANE + 1))}" '
            f'width="{s.num(max(1.0, x1 - x0))}" height="{LANE}" fill="{palette.colour(attempt)}" '
            f'stroke="#fff" stroke-width="0.5"{dash}>'
            f"{s.title(attempt_hover_text(attempt, t0, now))}</rect>"
        )
        if x1 - x0 > 34:  # room for the shard number: who ran which shard, without hovering
            label = f"{attempt.shard_index}" + (f"#{attempt.ordinal}" if attempt.retried else "")
            out.append(
                f'<text x="{s.num(x0 + 3)}" y="{s.num(y + lane * (LANE + 1) + LANE - 4)}" fill="#fff" '
                f'pointer-events="none">{s.esc(label)}</text>'
            )
    return used * (LANE + 1) - 1


def _strip(out: list[str], node: str, mine: list[AttemptFact], win, scale: s.Scale, y: float, now: float) -> float:
    act = series.activity(mine, win, BUCKETS, now)
    top = max(act.concurrency, default=0.0)
    width = win.span / BUCKETS
    for first, last, level in series.runs_of(series.quantize(act.concurrency, top, LEVELS)):
        if level == 0:
            continue
        t_a, t_b = win.t0 + first * width, win.t0 + (last + 1) * width
        mean = sum(act.concurrency[first : last + 1]) / (last - first + 1)
        done = sum(act.finished[first : last + 1])
        bad = sum(act.failed[first : last + 1])
        tip = (
            f"{node}: {format_wall(t_a - win.t0)} to {format_wall(t_b - win.t0)}\n"
            f"{mean:.2f} attempts running on average (busiest bucket of this node: {top:.2f})\n"
            f"{done} accepted, {bad} failed or lost attempts ended here"
        )
        out.append(
            f'<rect class="strip" x="{s.num(scale(t_a))}" y="{s.num(y)}" width="{s.num(scale(t_b) - scale(t_a))}" '
            f'height="{LANE}" fill="#2e7d32" fill-opacity="{0.15 + 0.85 * level / LEVELS:.2f}">{s.title(tip)}</rect>'
        )
    marks = [a for a in mine if a.outcome in (AttemptOutcome.FAILED, AttemptOutcome.LOST, AttemptOutcome.RUNNING)][
        :MAX_MARKS
    ]
    for attempt in marks:
        x = scale(attempt.end_or(now))
        category = palette.category(attempt)
        out.append(
            f'<rect class="bar bar-{category}" x="{s.num(x - 1)}" y="{s.num(y - 1)}" width="2" height="{LANE + 2}" '
            f'fill="{palette.colour(attempt)}">{s.title(attempt_hover_text(attempt, win.t0, now))}</rect>'
        )
    return LANE
