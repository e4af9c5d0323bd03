"""Shared storage underneath everything: careful file operations and who a process is.

``fsio`` (every file operation on a job directory, with the care NFS-like filesystems need),
``checked_writer`` (new files whose write, fsync and close errors all surface), ``fault_seam``
(the hook every file operation passes, for fault injection in tests) and ``identity`` (node, host,
kernel boot, pid namespace and pid of a worker).  No Ray, no Data-Juicer; nothing above ``errors``.
"""

# The package's modules (nothing is re-exported: import from the module you need).
__all__ = [
    "checked_writer",
    "fault_seam",
    "fsio",
    "identity",
]
