"""A rate and a time left that hold still while the count moves in steps.

Progress arrives in steps (Ray counts rows per finished block; other nodes' shards count once done),
so the rate over "now" swings with where the clock stands between two steps.  :class:`Meter` keeps
the moments the count moved and takes the rate between the last move and the count as it stood
``window`` seconds before it (interpolated between the moves around it; or further back, to the
``MIN_GAPS``-th move before the last, where moves are rarer than that): for a steady throughput
every move lies on one line, so the rate is that line's slope whatever the step size.  Only once
no move came for longer than the longest wait between two moves in the window does the time since
the last move count (a stall lowers the rate, in proportion; uneven steps do not).  The time left
runs on from the last move at that rate, so it counts down between steps instead of standing
still and then jumping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import pairwise
from typing import Final

from data_juicer_elastic.status.throughput import eta_secs

RATE_WINDOW_SECS: Final = 30.0
# No rate before the count has moved this often over this long: the first blocks of a run come
# as Ray's workers start, and a rate from two of them swings by a factor of several.
MIN_MOVES: Final = 3
MIN_SPAN_SECS: Final = 5.0
MIN_GAPS: Final = 4  # the rate spans at least this many waits between moves, older than the window if need be

Clock = Callable[[], float]


class Meter:
    """Units per second over the last ``window`` seconds of moves; see the module docstring.
    ``from_first_move``: counting starts at the first move, so the time before it (Ray starting,
    the first block read) is no part of the rate."""

    def __init__(self, clock: Clock, window: float = RATE_WINDOW_SECS, *, from_first_move: bool = False):
        self.clock, self.window, self.waits_for_move = clock, window, from_first_move
        self.moves: deque[tuple[float, float]] = deque()  # (time, value) at each change, oldest first

    def add(self, value: float) -> None:
        now = self.clock()
        if self.moves and value == self.moves[-1][1]:
            return
        if self.waits_for_move and self.moves:
            self.moves.clear()  # the first move: the rate counts from here
            self.waits_for_move = False
        self.moves.append((now, value))
        # keep one move at or before the window's start, to interpolate the count there, and at
        # least MIN_GAPS waits between moves: the longest of a few tells a stall from an uneven step
        while len(self.moves) > MIN_GAPS + 1 and self.moves[1][0] <= now - self.window:
            self.moves.popleft()

    def _slope(self) -> tuple[float, float, float, float] | None:
        """(rate, time of the last move, seconds the rate spans, the longest wait between two moves)
        over the window; None: too few moves."""
        if len(self.moves) < MIN_MOVES:
            return None
        t_last, v_last = self.moves[-1]
        start = t_last - self.window
        (t0, v0), (t1, v1) = self.moves[0], self.moves[1]
        if t0 < start < t1:  # the count at the window's start, between the two moves around it
            v0, t0 = v0 + (v1 - v0) * (start - t0) / (t1 - t0), start
        span = t_last - t0
        if span < MIN_SPAN_SECS or v_last <= v0:
            return None
        longest = max(b[0] - a[0] for a, b in pairwise(self.moves))
        return (v_last - v0) / span, t_last, span, longest

    def rate(self) -> float | None:
        found = self._slope()
        if found is None:
            return None
        rate, t_last, span, interval = found
        late = self.clock() - t_last - interval  # how far past the longest wait so far the next move is
        return rate if late <= 0 else rate * span / (span + late)

    def eta(self, total: float) -> float | None:
        """Seconds left to ``total`` at :meth:`rate`, counted on from the last move (for at most the
        longest wait between moves: past it the rate falls instead); None until there is a rate."""
        found, rate = self._slope(), self.rate()
        if found is None or not rate:
            return None
        _, t_last, _, interval = found
        done = self.moves[-1][1] + rate * min(max(self.clock() - t_last, 0.0), interval)
        return eta_secs(max(total - done, 0.0), rate)
