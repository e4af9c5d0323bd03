"""Shared storage underneath everything: careful file operations and who a process is.
No Ray, no Data-Juicer; nothing above ``errors``.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "fault_seam",
    "fsio",
    "identity",
]
