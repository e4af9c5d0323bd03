"""Quarantine: keep every good row of a batch an operator failed on, set the failing rows aside with why.

Under ``elastic_sharded`` with ``skip_op_error`` (Data-Juicer's default, which drops every row of
a failing batch silently) a failing batch is bisected down to the rows that fail alone; the
others are processed, the failing ones written to ``<export>_errors.jsonl`` and counted where
people look (docs/quarantine.md):

* ``bisect_rows``  - :func:`isolate`: the bisection, O(k log B) calls for k failing rows of B
* ``collector``    - inside the operators (Ray tasks and actors): Data-Juicer's error hooks,
  the attempt context, the per-process records
* ``errors_file``  - in the shard runner: the records folded into the attempt's ``errors.jsonl``
  with the input rows, and ``elastic.max_error_rows``
* ``errors_merge`` - at finalize: the accepted shards' files merged in input order

The file format and its checks are :mod:`data_juicer_elastic.jobdir.row_errors`.  Importing this
package imports neither Ray nor Data-Juicer.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = ["bisect_rows", "collector", "errors_file", "errors_merge"]
