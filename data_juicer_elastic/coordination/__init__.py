"""Many instances of one submission on one job directory (no Ray, no Data-Juicer imports).

Modules: ``run_id`` (which submission), ``run_records`` (coordination records and their
phase, outcome and exit codes), ``elections`` (leaders, their heartbeats through
``jobdir.heartbeats``, the run's one outcome), ``settle`` (abort watcher, strict-mode
waiting), ``flow`` (the whole sequence, steps passed in), ``slots`` (one worker process
per slot, GPU subsets), ``stragglers`` (claim gate).  The read-only view of runs is
``status.run_status``.
Import from the modules; nothing is re-exported here.
"""

__all__ = [
    "elections",
    "flow",
    "run_id",
    "run_records",
    "settle",
    "slots",
    "stragglers",
]
