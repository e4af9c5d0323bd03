"""Quarantine: keep every good row of a batch an operator failed on, set the failing rows aside with why.

Under ``elastic_sharded`` with ``skip_op_error`` (Data-Juicer's default drops every row of a failing
batch silently) a failing batch is bisected down to the rows that fail alone, which go to
``<export>_errors.jsonl`` (docs/quarantine.md): ``collector`` (inside the operators: the bisection
and the records; then the attempt's ``errors.jsonl``, ``elastic.max_error_rows``);
``shards.side_files`` merges them at finalize.  The file format is :mod:`data_juicer_elastic.jobdir.exports`.
Importing this package imports neither Ray nor Data-Juicer.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = ["collector"]
