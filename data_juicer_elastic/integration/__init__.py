"""How the plugin enters Data-Juicer, and what it checks on the way in.

* ``entrypoint``: the ``data_juicer.ops`` entry point Data-Juicer imports; it calls
  ``patches``, which decides *when* each patch goes in (``compat`` holds *how*);
* ``patch_records``: what became of each patch (applied, or missing and why), read by
  ``dispatch`` and ``doctor``; ``elastic_sharded`` refused while a required one is missing;
* ``dispatch``: the ``dj-process`` / ``dj-analyze`` mains: ``executor_type: elastic_sharded``
  to our executor, one-line errors with exit code 2;
* ``config_block``: the recipe's ``elastic:`` block in Data-Juicer's parser, and back out;
* ``analysis_outputs``: ``dj-analyze`` refused where it would overwrite an elastic job's files;
* ``driver_files``: Data-Juicer's work dir of an elastic run under the job directory, and a
  refused run's job directory removed again;
* ``recipe`` (the shard recipe each shard runs) and ``recipe_check`` (recipes that cannot
  run shard by shard, refused);
* ``doctor`` and ``mount_cache``: the checks behind ``dj-elastic doctor``;
* ``retry_command``: ``dj-elastic retry``, with the operator code checked before anything is
  requeued (a fix of the code accepted for the requeued shards), and the next commands.

Importing this package is cheap and imports no Data-Juicer module.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "analysis_outputs",
    "config_block",
    "dispatch",
    "doctor",
    "driver_files",
    "entrypoint",
    "mount_cache",
    "patch_records",
    "patches",
    "recipe",
    "recipe_check",
    "retry_command",
]
