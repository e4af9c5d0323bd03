"""Shared storage underneath everything: careful file operations and who a process is.

``fsio`` (every file operation on a job directory, with the care NFS-like filesystems need:
link()-publication, atomic replace, fsync, ENOSPC and EIO as clear errors) and ``identity``
(node, host, kernel boot, pid namespace and pid of a worker).  No Ray, no Data-Juicer; nothing
above ``errors`` is imported.
"""
