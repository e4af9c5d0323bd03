"""Deduplication across shards, engine-free: the files and computations of its phases.

``tables`` (the checksummed, block-indexed file format of every phase), ``keys`` (global row ids; bucket
keys from the hash column a Data-Juicer operator's ``compute_hash`` wrote), ``signatures`` (one shard's
keys per band, sorted), ``simhash_blocks`` (SimHash near pairs by the block method), ``buckets`` (a band's
key range from every shard, into star edges; exact dedup decides there), ``clusters`` (components
labelled by their smallest row, per-shard drop lists) and ``forests`` (edge files merged into star
forests in parallel, so the serial cluster step reads fewer edges), ``hash_quarantine`` (the quarantine lines of rows
whose hashing raised, for the merge).  No Ray, no Data-Juicer: the operators are called
by the layer that runs a shard.  Design and formulas: docs/dedup.md.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "buckets",
    "clusters",
    "forests",
    "hash_quarantine",
    "keys",
    "phase_progress",
    "phase_records",
    "phases",
    "signatures",
    "simhash_blocks",
    "stages",
    "tables",
]
