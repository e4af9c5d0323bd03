"""Small inline-SVG building blocks: escaping, linear scales, "nice" ticks, axes and number formats.

The report draws its charts itself instead of through matplotlib: the output is
a few kilobytes of plain SVG elements whose ``<title>`` children are the hover
tooltips, it is deterministic (tests compare it), needs no font files, and a
report of a 10,000-shard job renders in well under a second.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

# Every chart of the report page is this wide, with this right margin (they stack in one column).
CHART_WIDTH: Final = 1100
CHART_RIGHT: Final = 20

FONT: Final = "font-family:system-ui,sans-serif;font-size:11px"
AXIS_COLOUR: Final = "#888"
GRID_COLOUR: Final = "#e6e6e6"


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def num(value: float) -> str:
    """A coordinate with at most one decimal (keeps the file small, is exact enough on screen)."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def title(text: str) -> str:
    return f"<title>{esc(text)}</title>"


@dataclass(frozen=True)
class Scale:
    """Linear map from a data domain to a pixel range (a zero-width domain maps to the range's start)."""

    d0: float
    d1: float
    r0: float
    r1: float

    def __call__(self, value: float) -> float:
        if self.d1 == self.d0:
            return self.r0
        return self.r0 + (value - self.d0) * (self.r1 - self.r0) / (self.d1 - self.d0)


def nice_step(span: float, target: int, steps: Sequence[float] = (1, 2, 2.5, 5, 10)) -> float:
    """A round step that cuts ``span`` into about ``target`` parts."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(1, target)
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in steps:
        if factor * magnitude >= raw:
            return factor * magnitude
    return 10 * magnitude


# Round durations for a time axis, in seconds: a tick every 1 s ... 1 day.
_TIME_STEPS: Final = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def time_ticks(span: float, target: int = 8) -> list[float]:
    raw = span / max(1, target)
    step = next((s for s in _TIME_STEPS if s >= raw), None)
    if step is None:
        step = 86400 * math.ceil(raw / 86400)
    return [i * step for i in range(int(span // step) + 1)]


def value_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    step = nice_step(hi - lo, target)
    first = math.ceil(lo / step) * step
    count = int((hi - first) / step + 1e-9) + 1
    return [first + i * step for i in range(max(count, 0))]


def fmt_count(value: float) -> str:
    """Compact axis labels: 950, 1.2k, 3.4M (exact values go in tooltips and tables)."""
    magnitude = abs(value)
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= threshold:
            return f"{value / threshold:.3g}{suffix}"
    return f"{value:.3g}"


def fmt_bytes(value: float) -> str:
    for threshold, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= threshold:
            return f"{value / threshold:.3g} {unit}"
    return f"{value:.0f} B"


def bytes_ticks(lo: float, hi: float, target: int = 8):
    """(ticks in bytes, formatter): round values in the unit of ``hi`` (KiB, MiB...), so no two read alike."""
    unit, name = 1.0, "B"
    for exponent, label in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if hi >= 2.0**exponent:
            unit, name = 2.0**exponent, label
            break
    ticks = value_ticks(lo / unit, hi / unit, target)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    decimals = max(0, min(3, -math.floor(math.log10(step)))) if step > 0 else 0
    return [t * unit for t in ticks], lambda value: f"{value / unit:.{decimals}f} {name}"


def svg_open(width: float, height: float, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" aria-label="{esc(label)}" '
        f'width="{num(width)}" height="{num(height)}" viewBox="0 0 {num(width)} {num(height)}" style="{FONT}">'
    )


def text(x: float, y: float, content: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{num(x)}" y="{num(y)}" text-anchor="{anchor}"{extra}>{esc(content)}</text>'


def x_axis(scale: Scale, ticks: Iterable[float], y: float, top: float, fmt, label: str = "") -> list[str]:
    """Tick labels below ``y`` and light vertical grid lines up to ``top``."""
    out = [f'<line x1="{num(scale.r0)}" y1="{num(y)}" x2="{num(scale.r1)}" y2="{num(y)}" stroke="{AXIS_COLOUR}"/>']
    for tick in ticks:
        x = scale(tick)
        out.append(f'<line x1="{num(x)}" y1="{num(top)}" x2="{num(x)}" y2="{num(y)}" stroke="{GRID_COLOUR}"/>')
        out.append(text(x, y + 14, fmt(tick), "middle"))
    if label:
        out.append(text((scale.r0 + scale.r1) / 2, y + 30, label, "middle", ' fill="#555"'))
    return out


def y_axis(scale: Scale, ticks: Iterable[float], x: float, right: float, fmt, label: str = "") -> list[str]:
    out = [f'<line x1="{num(x)}" y1="{num(scale.r0)}" x2="{num(x)}" y2="{num(scale.r1)}" stroke="{AXIS_COLOUR}"/>']
    for tick in ticks:
        y = scale(tick)
        out.append(f'<line x1="{num(x)}" y1="{num(y)}" x2="{num(right)}" y2="{num(y)}" stroke="{GRID_COLOUR}"/>')
        out.append(text(x - 5, y + 4, fmt(tick), "end"))
    if label:
        mid = (scale.r0 + scale.r1) / 2
        out.append(
            f'<text x="12" y="{num(mid)}" text-anchor="middle" fill="#555" '
            f'transform="rotate(-90 12 {num(mid)})">{esc(label)}</text>'
        )
    return out


def legend(items: Sequence[tuple[str, str]], x: float, y: float, width: float) -> tuple[list[str], float]:
    """Colour swatches with labels, wrapped to ``width``; returns (elements, height used)."""
    out: list[str] = []
    cx, cy = x, y
    for colour, label in items:
        w = 22 + 6.5 * len(label)
        if cx + w > x + width and cx > x:
            cx, cy = x, cy + 16
        out.append(f'<rect x="{num(cx)}" y="{num(cy - 9)}" width="12" height="10" fill="{colour}"/>')
        out.append(text(cx + 16, cy, label))
        cx += w
    return out, cy - y + 16
