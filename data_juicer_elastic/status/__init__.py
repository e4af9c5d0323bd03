"""A job's state presented: ``dj-elastic status`` and the numbers the console and executor show.

``snapshot_types`` (the snapshot's data: ``ShardStatus``, ``JobSnapshot``), ``job_status``
(reads the job directory into a snapshot, states decided by ``jobdir.shard_state``;
``--json``), ``throughput`` (rates, ETA, per-node numbers, stragglers from one snapshot),
``status_text`` (the human-readable table), ``summary_mode`` (what a status reads besides the
job summary, when there is one), ``run_status`` (the coordination records of
each run, and the ``status`` command), ``scan_phase`` (how far the scans of a planned job
are, how fast they read, the time to the first shard running), ``job_times`` (a run's wall
time, the one the closing summary, ``status`` and the report show).  Imports run one way:
``scan_phase`` <- ``snapshot_types`` <- ``summary_mode`` /
``throughput`` <- ``status_text`` / ``job_status`` <- ``run_status``.  Reads only; no Ray,
no Data-Juicer imports.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "job_status",
    "job_times",
    "run_status",
    "scan_phase",
    "snapshot_types",
    "status_text",
    "summary_mode",
    "throughput",
]
