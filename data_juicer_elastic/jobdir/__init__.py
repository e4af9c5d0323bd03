"""The job-directory protocol: who may do what to a task, recorded on shared storage (no Ray, no
Data-Juicer; nothing re-exported).  docs/architecture.md describes each module."""

__all__ = [
    "attempts",
    "claiming",
    "exports",
    "heartbeats",
    "job_summary",
    "layout",
    "manifest",
    "records",
    "retry",
    "roles",
    "shard_state",
    "task_queue",
    "worker",
]
