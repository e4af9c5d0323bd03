"""Throughput over time, progress, shard size vs duration, and adaptive-batching size traces (SVG)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from itertools import cycle
from typing import Final

from data_juicer_elastic.report import palette, series
from data_juicer_elastic.report import svg as s
from data_juicer_elastic.report.attempt_facts import AttemptFact, AttemptOutcome
from data_juicer_elastic.report.facts import TraceFact
from data_juicer_elastic.report.timeline import attempt_hover_text
from data_juicer_elastic.status.job_times import format_wall

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
        for (node, values), colour in zip(data.by_node.items(), cycle(palette.SERIES[1:]), strict=False):
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
            f'fill="{palette.colour(attempt)}" fill-opacity="0.75">'
            f"{s.title(attempt_hover_text(attempt, t0, t0))}</circle>"
        )
    legend, _ = s.legend(palette.legend_items()[:-1], LEFT, 14, LEGEND_WIDTH)
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
    for trace, colour in zip(traces, cycle(palette.SERIES), strict=False):
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
