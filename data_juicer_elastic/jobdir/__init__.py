"""The job-directory protocol: who may do what to a shard, recorded on shared storage.

Paths and writes: ``layout`` (every path), ``confine`` (every write inside the job dir).  Records,
one module per kind: ``records`` (encode/parse machinery, the manifest), ``lease_records`` (claim,
heartbeat, release, failure of a generation), ``result_records`` (attempt, result, terminal
failure, merge), ``cleaned`` (the shard outputs were removed), ``plan_records`` (the plan, each
shard's scan), ``reasons`` (every reason code).
Rules, one owner each: ``manifest`` (loading and checking the plan and the job), ``manifest_rows``
(the manifest's rows in a small record beside it, for status), ``scans`` (the manifest composed
from the scans), ``shard_state`` (done / failed / running / stale / pending; is
the job finished), ``heartbeats`` (staleness on the observer's clock), ``leases`` (claims,
takeover, release, self-fencing), ``attempts`` (attempt dirs, first-wins publication),
``failures`` (retry and death budgets), ``liveness`` / ``progress`` (is a running attempt alive;
its progress record).  The job summary: ``job_summary``, ``summary_brief`` (the part every worker
reads), ``pace`` (each worker's pace record), ``roles`` (a role held as a one-task lease: the
summary's writer, one round of it; a run's prepare and finalize).
The worker: ``claiming`` / ``claim_ahead`` (finding the next shard), ``shard_attempt`` (one
claimed shard, every way out recorded), ``worker_loop``, ``worker_settings``, ``worker_signals``,
``scan_loop`` (the scan phase), ``scan_outcome`` (how the scans ended: the input accepted, refused
at ``file:line``, or a scan failed).  Tools: ``retry`` (``code_changes``: operator code a retry
accepted), ``export_path``, ``own_export`` (the export files this job wrote), ``recipe_diff``,
``row_stats``, ``row_errors``, ``published_file``, ``tasks``.  No Ray, no Data-Juicer imports;
nothing is re-exported, so importing one stays cheap.
"""

__all__ = [
    "attempts",
    "claim_ahead",
    "claiming",
    "cleaned",
    "code_changes",
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
    "manifest_rows",
    "own_export",
    "pace",
    "plan_records",
    "progress",
    "published_file",
    "reasons",
    "recipe_diff",
    "records",
    "result_records",
    "retry",
    "roles",
    "row_errors",
    "row_stats",
    "scan_loop",
    "scan_outcome",
    "scans",
    "shard_attempt",
    "shard_state",
    "summary_brief",
    "tasks",
    "worker_loop",
    "worker_settings",
    "worker_signals",
]
