"""The job-directory protocol: who may do what to a shard, recorded on shared storage.

Paths and writes: ``layout`` (every path), ``confine`` (every write inside the job dir).
Records (one module owns each kind): ``records`` (encode/parse machinery, the manifest),
``lease_records`` (claim, heartbeat, release, failure of a generation), ``result_records``
(attempt, result, terminal failure, merge), ``reasons`` (every reason code, as StrEnums),
``manifest`` (loading and checking the plan and the prepared job), ``plan_records`` (the plan
and each shard's scan record), ``scans`` (publishing scans, composing the manifest from them).
Rules (one owner each): ``shard_state`` (done / failed / corrupt / running / stale /
pending), ``heartbeats`` (staleness on the observer's clock; the renew thread),
``leases`` (claims, takeover, release, the lease heartbeater and self-fencing),
``attempts`` (attempt dirs, first-wins publication, result validation), ``failures``
(failure records, retry and death budgets, terminal failure), ``liveness`` / ``progress``
(is a running attempt alive; its live progress record), ``outcome`` (is the job finished).
The job summary: ``job_summary`` (the summary and its sequence record, read instead of every
shard), ``pace`` (each worker process's pace record: what it holds, how fast it finishes),
``summary_keeper`` (the writer's lease and one round of composing the summary).
The worker: ``claiming`` / ``claim_ahead`` (finding the next shard), ``shard_attempt``
(running one claimed shard, every way out recorded), ``worker_loop`` (the loop),
``worker_settings`` (the loop's lease, timing and limit values as one object),
``worker_signals`` (SIGTERM/SIGINT), ``scan_loop`` (the scan phase: claiming and running the
shards' scans, then the barrier).  Tools: ``retry``, ``export_path``, ``recipe_diff``,
``row_stats``, ``row_errors`` (the quarantine file), ``published_file``, ``tasks``.
No Ray, no Data-Juicer imports.  Import from the modules; nothing is re-exported here so
that importing one piece stays cheap.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "attempts",
    "claim_ahead",
    "claiming",
    "confine",
    "export_path",
    "failures",
    "heartbeats",
    "job_summary",
    "layout",
    "lease_records",
    "leases",
    "liveness",
    "manifest",
    "outcome",
    "pace",
    "plan_records",
    "progress",
    "published_file",
    "reasons",
    "recipe_diff",
    "records",
    "result_records",
    "retry",
    "row_errors",
    "row_stats",
    "scan_loop",
    "scans",
    "shard_attempt",
    "shard_state",
    "summary_keeper",
    "tasks",
    "worker_loop",
    "worker_settings",
    "worker_signals",
]
