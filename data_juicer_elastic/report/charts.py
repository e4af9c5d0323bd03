"""The report's charts (SVG): the per-node timeline of attempts (Gantt-style: one bar per attempt
while that stays readable, else one activity strip per node with every failed or lost attempt still
marked individually), throughput over time, progress, shard size vs duration, and adaptive-batching
size traces; one colour per kind of attempt, so the timeline, the scatter and their legends agree."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from itertools import cycle
from typing import Final

from data_juicer_elastic.report import series
from data_juicer_elastic.report import svg as s
from data_juicer_elastic.status.job_history import AttemptFact, AttemptOutcome, TraceFact
from data_juicer_elastic.status.job_times import format_wall, utc_stamp

DONE: Final = "done"
DONE_AFTER_RETRY: Final = "done after retry"

CATEGORY_COLOURS: Final = {
    DONE: "#43a047",
    DONE_AFTER_RETRY: "#8e24aa",
    AttemptOutcome.FAILED.value: "#e53935",
    AttemptOutcome.LOST.value: "#fb8c00",
    AttemptOutcome.DISCARDED.value: "#9e9e9e",
    AttemptOutcome.RUNNING.value: "#1e88e5",
}
# Distinct, colour-blind-friendlier series colours (Okabe-Ito, then greys).
SERIES: Final = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000", "#999999")


def attempt_category(attempt: AttemptFact) -> str:
    if attempt.outcome is AttemptOutcome.DONE:
        return DONE_AFTER_RETRY if attempt.retried else DONE
    return attempt.outcome.value


def attempt_colour(attempt: AttemptFact) -> str:
    return CATEGORY_COLOURS[attempt_category(attempt)]


def attempt_legend() -> list[tuple[str, str]]:
    return [(c, name) for name, c in CATEGORY_COLOURS.items()]


MAX_BARS: Final = 2000  # above this many attempts, nodes are drawn as activity strips
MAX_NODES: Final = 48  # node rows; the rest share one "other" row
MAX_SLOT_LANES: Final = 8  # concurrent attempts drawn side by side on one node
MAX_MARKS: Final = 2000  # failed/lost attempts marked individually on activity strips
BUCKETS: Final = 240
LEVELS: Final = 8
TIMELINE_LEFT: Final = 150
LANE: Final = 16
GAP: Final = 6


def attempt_hover_text(attempt: AttemptFact, t0: float, now: float) -> str:
    """The hover text of one attempt."""
    end = attempt.end_or(now)
    lines = [
        f"{attempt.shard_id} attempt {attempt.ordinal} (generation {attempt.generation})",
        f"node {attempt.node_id} ({attempt.hostname}, pid {attempt.pid})",
        f"{format_wall(attempt.started_at - t0)} to {format_wall(end - t0)} "
        f"({format_wall(end - attempt.started_at)}), started {utc_stamp(attempt.started_at)}",
        f"{attempt_category(attempt)} [{attempt.detail}]: {attempt.input_rows} input rows"
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
    scale = s.Scale(win.t0, win.t1, TIMELINE_LEFT, s.CHART_WIDTH - s.CHART_RIGHT)
    legend, legend_h = s.legend(attempt_legend(), TIMELINE_LEFT, 14, s.CHART_WIDTH - TIMELINE_LEFT - s.CHART_RIGHT)
    top = 14 + legend_h
    body: list[str] = []
    y = top
    for node, mine in rows:
        if aggregated:
            height = _strip(body, node, mine, win, scale, y, now)
        else:
            height = _bars(body, mine, scale, y, win.t0, now)
        body.append(
            f'<text x="{TIMELINE_LEFT - 6}" y="{s.num(y + LANE - 2)}" text-anchor="end">'
            f"{s.title(node)}{s.esc(node[:24])}</text>"
        )
        body.append(
            f'<line x1="{TIMELINE_LEFT}" y1="{s.num(y + height + GAP / 2)}" x2="{s.CHART_WIDTH - s.CHART_RIGHT}" '
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
    out.append(s.text(TIMELINE_LEFT, axis_y + 32, f"elapsed since the first attempt started ({utc_stamp(win.t0)})"))
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
        kind = attempt_category(attempt).replace(" ", "-")
        dash = ' stroke-dasharray="3 2"' if attempt.end_estimated else ""
        out.append(
            f'<rect class="bar bar-{kind}" x="{s.num(x0)}" y="{s.num(y + lane * (LANE + 1))}" '
            f'width="{s.num(max(1.0, x1 - x0))}" height="{LANE}" fill="{attempt_colour(attempt)}" '
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
        kind = attempt_category(attempt)
        out.append(
            f'<rect class="bar bar-{kind}" x="{s.num(x - 1)}" y="{s.num(y - 1)}" width="2" height="{LANE + 2}" '
            f'fill="{attempt_colour(attempt)}">{s.title(attempt_hover_text(attempt, win.t0, now))}</rect>'
        )
    return LANE


HEIGHT: Final = 260
LEFT: Final = 70
TOP: Final = 30
MAX_POINTS: Final = 3000  # scatter points; beyond, accepted attempts are sampled (outliers kept)
KEEP_SLOWEST: Final = 100
MAX_TRACE_LINES: Final = 12  # size traces per stage chart
MAX_STAGE_CHARTS: Final = 6
RIGHT: Final = s.CHART_WIDTH - s.CHART_RIGHT  # the plot area's right edge
LEGEND_WIDTH: Final = RIGHT - LEFT


def _frame(label: str, height: float = HEIGHT) -> tuple[list[str], float]:
    bottom = height - 45
    return [s.svg_open(s.CHART_WIDTH, height, label)], bottom


def _polyline(points: Sequence[tuple[float, float]], colour: str, width: float, extra: str = "") -> str:
    coords = " ".join(f"{s.num(x)},{s.num(y)}" for x, y in points)
    return f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="{width}"{extra}/>'


def _time_axis(xs: s.Scale, win: series.Window, bottom: float) -> list[str]:
    return s.x_axis(xs, [win.t0 + t for t in s.time_ticks(win.span)], bottom, TOP, lambda t: format_wall(t - win.t0))


def throughput_svg(attempts: Sequence[AttemptFact], win: series.Window) -> str:
    data = series.throughput(attempts, win)
    out, bottom = _frame("throughput over time")
    peak = max(data.total, default=0.0) or 1.0
    xs = s.Scale(win.t0, win.t1, LEFT, RIGHT)
    ys = s.Scale(0, peak * 1.1, bottom, TOP)
    out += _time_axis(xs, win, bottom)
    out += s.y_axis(ys, s.value_ticks(0, peak * 1.1), LEFT, RIGHT, s.fmt_count, "input rows/s")
    centres = [(a + b) / 2 for a, b in zip(data.edges, data.edges[1:], strict=False)]
    total = [(xs(t), ys(v)) for t, v in zip(centres, data.total, strict=True)]
    area = [(xs(win.t0), ys(0)), *total, (xs(win.t1), ys(0))]
    out.append(_polyline(area, "none", 0, ' fill="#0072b2" fill-opacity="0.12" class="area"'))
    legend_items = [("#0072b2", "all nodes")]
    if len(data.by_node) > 1:
        for (node, values), colour in zip(data.by_node.items(), cycle(SERIES[1:]), strict=False):
            out.append(_polyline([(xs(t), ys(v)) for t, v in zip(centres, values, strict=True)], colour, 1))
            legend_items.append((colour, node))
    out.append(_polyline(total, "#0072b2", 2, ' class="series-total"'))
    width = xs(data.edges[1]) - xs(data.edges[0])
    for i, t in enumerate(centres):  # invisible hover targets, one per bin
        per_node = "; ".join(f"{n} {v[i]:.1f}" for n, v in data.by_node.items() if v[i] > 0)
        tip = f"{format_wall(data.edges[i] - win.t0)}: {data.total[i]:.1f} input rows/s" + (
            f"\n{per_node}" if per_node else ""
        )
        out.append(
            f'<rect x="{s.num(xs(t) - width / 2)}" y="{TOP}" width="{s.num(width)}" height="{s.num(bottom - TOP)}" '
            f'fill="transparent">{s.title(tip)}</rect>'
        )
    legend, _ = s.legend(legend_items, LEFT, 14, LEGEND_WIDTH)
    out += legend
    out.append("</svg>")
    return "".join(out)


def progress_svg(attempts: Sequence[AttemptFact], win: series.Window, total_rows: int) -> str:
    points = series.cumulative_done(attempts)
    out, bottom = _frame("input rows done over time", 200)
    xs = s.Scale(win.t0, win.t1, LEFT, RIGHT)
    ys = s.Scale(0, 100, bottom, TOP)
    out += _time_axis(xs, win, bottom)
    out += s.y_axis(ys, [0, 25, 50, 75, 100], LEFT, RIGHT, lambda v: f"{v:.0f}%", "% of input rows")
    steps = [(xs(win.t0), ys(0))]
    for when, done in points:
        pct = 100.0 * done / total_rows if total_rows else 0.0
        steps += [(xs(when), steps[-1][1]), (xs(when), ys(pct))]
    steps.append((xs(win.t1), steps[-1][1]))
    out.append(_polyline(steps, "#009e73", 2, ' class="series-progress"'))
    done = points[-1][1] if points else 0
    out.append(s.text(LEFT + 6, TOP - 8, f"{done:,} of {total_rows:,} input rows in accepted shard results"))
    out.append("</svg>")
    return "".join(out)


def _scatter_points(attempts: Sequence[AttemptFact]) -> tuple[list[AttemptFact], int]:
    ended = [a for a in attempts if a.ended_at is not None]
    if len(ended) <= MAX_POINTS:
        return ended, len(ended)
    other = [a for a in ended if a.outcome is not AttemptOutcome.DONE][: MAX_POINTS // 2]
    accepted = sorted((a for a in ended if a.outcome is AttemptOutcome.DONE), key=lambda a: a.ended_at - a.started_at)
    slowest, rest = accepted[-KEEP_SLOWEST:], accepted[:-KEEP_SLOWEST]
    room = max(0, MAX_POINTS - len(other) - len(slowest))
    step = max(1, -(-len(rest) // room)) if room else len(rest) + 1
    return other + rest[::step] + slowest, len(ended)


def scatter_svg(attempts: Sequence[AttemptFact], t0: float) -> tuple[str, str]:
    shown, total = _scatter_points(attempts)
    out, bottom = _frame("shard size vs attempt duration", 300)
    sizes = [a.input_bytes for a in shown] or [0]
    pad = max(1.0, (max(sizes) - min(sizes)) * 0.05)
    min_x, max_x = max(0.0, min(sizes) - pad), max(sizes) + pad
    max_y = max((a.ended_at - a.started_at for a in shown), default=1.0) * 1.1 or 1.0
    xs = s.Scale(min_x, max_x, LEFT, RIGHT)
    ys = s.Scale(0, max_y, bottom, TOP)
    ticks, fmt = s.bytes_ticks(min_x, max_x)
    out += s.x_axis(xs, ticks, bottom, TOP, fmt, "shard input size")
    out += s.y_axis(ys, s.value_ticks(0, max_y), LEFT, RIGHT, format_wall, "attempt duration")
    for attempt in shown:
        duration = attempt.ended_at - attempt.started_at
        out.append(
            f'<circle class="point" cx="{s.num(xs(attempt.input_bytes))}" cy="{s.num(ys(duration))}" r="3.5" '
            f'fill="{attempt_colour(attempt)}" fill-opacity="0.75">'
            f"{s.title(attempt_hover_text(attempt, t0, t0))}</circle>"
        )
    legend, _ = s.legend(attempt_legend()[:-1], LEFT, 14, LEGEND_WIDTH)
    out += legend
    out.append("</svg>")
    note = "Every ended attempt: x is its shard's input size, y how long the attempt ran."
    if len(shown) < total:
        note += (
            f" Showing {len(shown):,} of {total:,} attempts: every failed or lost one, the {KEEP_SLOWEST} slowest "
            "accepted ones, and an even sample of the rest."
        )
    return "".join(out), note


def batching_svgs(traces: Sequence[TraceFact]) -> list[tuple[str, str]]:
    """(stage key, SVG) per operator stage: micro-batch rows per call, OOMs marked."""
    by_stage: dict[str, list[TraceFact]] = defaultdict(list)
    for trace in traces:
        if trace.events:
            by_stage[trace.stage_key].append(trace)
    charts = []
    for stage in sorted(by_stage)[:MAX_STAGE_CHARTS]:
        mine = sorted(by_stage[stage], key=lambda t: (-sum(e[0] == "oom" for e in t.events), t.shard_id))
        charts.append((stage, _trace_chart(stage, mine[:MAX_TRACE_LINES], len(mine))))
    return charts


def _trace_chart(stage: str, traces: Sequence[TraceFact], total: int) -> str:
    out, bottom = _frame(f"adaptive batching size trace of {stage}", 240)
    longest = max(len(t.events) for t in traces)
    peak = max(e[1] for t in traces for e in t.events) * 1.1 or 1.0
    xs = s.Scale(0, max(1, longest - 1), LEFT, RIGHT)
    ys = s.Scale(0, peak, bottom, TOP)
    calls = s.value_ticks(0, max(1, longest - 1), 10)
    out += s.x_axis(xs, calls, bottom, TOP, lambda v: f"{v:.0f}", "call (most recent calls of each process)")
    out += s.y_axis(ys, s.value_ticks(0, peak), LEFT, RIGHT, s.fmt_count, "rows per call")
    legend_items = []
    for trace, colour in zip(traces, cycle(SERIES), strict=False):
        points = [(xs(i), ys(e[1])) for i, e in enumerate(trace.events)]
        out.append(_polyline(points, colour, 1.5, ' class="trace"'))
        for i, (outcome, rows, cost, budget) in enumerate(trace.events):
            tip = f"{trace.shard_id} ({trace.host} pid {trace.pid}) call {i}: {outcome}, {rows} rows, cost {cost:g}" + (
                f", budget {budget:g}" if budget is not None else ""
            )
            x, y = points[i]
            if outcome == "oom":
                out.append(
                    f'<path class="oom" d="M{s.num(x - 4)},{s.num(y - 4)}l8,8m0,-8l-8,8" stroke="#e53935" '
                    f'stroke-width="2">{s.title(tip)}</path>'
                )
            else:
                out.append(f'<circle cx="{s.num(x)}" cy="{s.num(y)}" r="2.5" fill="{colour}">{s.title(tip)}</circle>')
        legend_items.append((colour, f"{trace.shard_id[5:10]} pid {trace.pid}"))
    legend, _ = s.legend([*legend_items, ("#e53935", "x = out of memory")], LEFT, 14, LEGEND_WIDTH)
    out += legend
    if total > len(traces):
        out.append(s.text(RIGHT, bottom + 30, f"{len(traces)} of {total} traces (most OOMs first)", "end"))
    out.append("</svg>")
    return "".join(out)
