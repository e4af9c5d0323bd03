"""A job's state presented: ``dj-elastic status`` and the numbers the console and executor show.

``job_status`` (a read-only snapshot of the job directory; ``--json``), ``throughput`` (rates,
ETA, per-node numbers, stragglers from one snapshot), ``status_text`` (the human-readable
table), ``run_status`` (the coordination records of each run).  Reads only; no Ray, no
Data-Juicer imports.
"""
