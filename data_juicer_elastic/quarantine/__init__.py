"""Quarantine: keep every good row of a batch an operator failed on, set the failing rows aside with why.

Under ``elastic_sharded`` with ``skip_op_error`` (Data-Juicer's default, which drops every row of
a failing batch silently) a failing batch is bisected down to the rows that fail alone; the others
are processed, the failing ones written to ``<export>_errors.jsonl`` (docs/quarantine.md):
``bisect_rows`` (:func:`isolate`, O(k log B) calls for k failing rows of B), ``collector`` (inside
the operators: Data-Juicer's error hooks, the per-process records), ``errors_file`` (in the shard
runner: the attempt's ``errors.jsonl``, ``elastic.max_error_rows``) and ``errors_merge`` (at
finalize, in input order).  The file format is :mod:`data_juicer_elastic.jobdir.row_errors`.
Importing this package imports neither Ray nor Data-Juicer.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = ["bisect_rows", "collector", "errors_file", "errors_merge"]
