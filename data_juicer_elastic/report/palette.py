"""Colours: one per kind of attempt (the timeline, the scatter and their legends agree) and per series."""

from __future__ import annotations

from typing import Final

from data_juicer_elastic.report.attempt_facts import AttemptFact, AttemptOutcome

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


def category(attempt: AttemptFact) -> str:
    if attempt.outcome is AttemptOutcome.DONE:
        return DONE_AFTER_RETRY if attempt.retried else DONE
    return attempt.outcome.value


def colour(attempt: AttemptFact) -> str:
    return CATEGORY_COLOURS[category(attempt)]


def legend_items() -> list[tuple[str, str]]:
    return [(c, name) for name, c in CATEGORY_COLOURS.items()]
