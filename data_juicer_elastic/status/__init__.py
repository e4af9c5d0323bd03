"""A job's state presented, read only: ``dj-elastic status``, the report's history of attempts, and
the times the console, ``status`` and the report show; no Ray, no Data-Juicer imports."""

__all__ = [
    "job_history",
    "job_status",
    "job_times",
    "job_view",
    "run_status",
    "scan_phase",
    "snapshot_types",
    "throughput",
]
