"""The job-directory protocol: who may do what to a shard, recorded on shared storage.

``layout`` (every path), ``confine`` (every write inside the job dir), ``records`` (on-disk
records, one encode/parse pair per kind), ``manifest`` (the prepared job), ``leases`` (claims,
heartbeats, staleness, takeover), ``claiming`` / ``claim_ahead`` (finding the next shard),
``attempts`` (attempt dirs, first-wins publication, failure accounting), ``shard_state``
(the one rule for done/failed/corrupt/claimed/pending), ``liveness`` / ``progress`` (is a
running attempt alive), ``worker_loop`` (claim, run, publish, release, repeat), ``retry``,
``outcome``, ``export_path``, ``recipe_diff``, ``row_stats``, ``published_file``, ``tasks``.
No Ray, no Data-Juicer imports.  Import from the modules; nothing is re-exported here so
that importing one piece stays cheap.
"""
