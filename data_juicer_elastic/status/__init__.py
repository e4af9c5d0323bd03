"""A job's state presented: ``dj-elastic status`` and the times the console and the report show.

``snapshot_types`` (the snapshot's data: ``ShardStatus``, ``JobSnapshot``), ``job_status``
(reads the job directory into a snapshot, states decided by ``jobdir.shard_state``),
``throughput`` (rates, ETA, per-node numbers, stragglers from one snapshot), ``status_text``
(the human-readable table), ``done_tally`` (accepted results per node from the workers' pace
records, reconciled with the ``done/`` listing), ``run_status`` (the coordination records of
each run), ``scan_phase`` (how far the scans of a planned job are, how fast they read),
``job_times`` (when the latest run was submitted, had its first shard running, its last shard
done and ended: the one set of times the closing summary, ``status`` and the report show),
``job_view`` (the job read once into one view, and the ``status`` command rendered from it:
text, ``--json``, ``--watch``).  Imports run one way: ``scan_phase`` <- ``snapshot_types`` <-
``throughput`` <- ``status_text`` / ``done_tally`` <- ``job_status`` / ``job_times`` /
``run_status`` <- ``job_view``.  Reads only; no Ray, no Data-Juicer imports.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "done_tally",
    "job_status",
    "job_times",
    "job_view",
    "run_status",
    "scan_phase",
    "snapshot_types",
    "status_text",
    "throughput",
]
