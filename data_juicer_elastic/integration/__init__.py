"""How the plugin enters Data-Juicer, and what it checks on the way in.
Importing this package is cheap and imports no Data-Juicer module.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "analysis_outputs",
    "config_block",
    "dedup_check",
    "dispatch",
    "doctor",
    "driver_files",
    "entrypoint",
    "mount_cache",
    "patch_records",
    "patches",
    "recipe",
    "retry_command",
]
