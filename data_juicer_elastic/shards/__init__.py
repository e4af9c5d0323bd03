"""The data path, shard level: the input cut into shards and scanned on the way in; the accepted shard outputs
merged, published, verified and cleaned on the way out (docs/architecture.md lists the modules)."""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "clean",
    "merge",
    "merge_files",
    "parts",
    "plan",
    "prepare",
    "scan",
    "side_files",
    "steps",
    "verify",
]
