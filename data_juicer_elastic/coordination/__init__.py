"""Many instances of one submission on one job directory (no Ray, no Data-Juicer imports)."""

__all__ = [
    "flow",
    "run",
    "slots",
    "stragglers",
]
