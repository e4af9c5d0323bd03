"""How stale a name on the job directory's mount can look, against the job's lease timing
(docs/failure-semantics.md, "Choosing the TTL for a mount": live holders never look stale when
``TTL >= 3 x (C + H)``, C the mount's cache lag, H the heartbeat).  ``dj-elastic doctor --job-dir``
reads the mount from /proc/self/mountinfo, estimates C from its options and warns, with settings
that would satisfy the rule (breaking it is safe but does shards twice).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

LOCAL_LAG_SECS: Final = 1.0  # a local disk, or NFS without caching: ~1 s (the doc's table)
NFS_DEFAULT_ACDIRMAX: Final = 60.0  # Linux NFS client default
_LOCAL: Final = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "ramfs"})


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    options: dict[str, str]  # per-mount and superblock options; flags map to ""


@dataclass(frozen=True)
class LeaseAdvice:
    ok: bool | None  # None: the cache lag of this filesystem is unknown here
    detail: str


def mount_of(path: str | os.PathLike, mountinfo: str | None = None) -> Mount | None:
    """The mount holding ``path`` (longest mount point that is a prefix of its real path)."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    target = os.path.realpath(path)
    holding = [m for m in map(_parse, mountinfo.splitlines()) if m is not None and _contains(m.mount_point, target)]
    # The longest mount point; of equal ones the last line's, the mount on top (max keeps the first).
    return max(reversed(holding), key=lambda mount: len(mount.mount_point), default=None)


def _parse(line: str) -> Mount | None:
    # id parent major:minor root mount_point mount_options [optional...] - fstype source super_options
    left, sep, right = line.partition(" - ")
    fields, tail = left.split(), right.split()
    if not sep or len(fields) < 6 or len(tail) < 2:
        return None
    items = f"{fields[5]},{tail[2] if len(tail) > 2 else ''}".split(",")
    options = {key: value for key, _, value in (item.partition("=") for item in items if item)}
    return Mount(_unescape(fields[4]), tail[0], options)


def _unescape(field: str) -> str:
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _contains(mount_point: str, target: str) -> bool:
    return mount_point == "/" or target == mount_point or target.startswith(mount_point.rstrip("/") + "/")


def cache_lag_secs(mount: Mount) -> float | None:
    """C for this mount, or None when it cannot be told from the options."""
    fstype, options = mount.fstype, mount.options
    if fstype in _LOCAL:
        return LOCAL_LAG_SECS
    if fstype not in ("nfs", "nfs4"):
        return None  # FUSE, CIFS, Lustre, GPFS, CPFS...: their caches are configured elsewhere
    if "noac" in options or options.get("lookupcache") == "none":
        return LOCAL_LAG_SECS
    for key in ("actimeo", "acdirmax"):
        if options.get(key, "").isdigit():
            return max(LOCAL_LAG_SECS, float(options[key]))
    return NFS_DEFAULT_ACDIRMAX


def advise(mount: Mount, ttl_secs: float, heartbeat_secs: float, source: str) -> LeaseAdvice:
    """Whether ``ttl >= 3 x (C + H)`` holds on ``mount``, and what would satisfy it."""
    where = f"{mount.fstype} at {mount.mount_point}"
    lag = cache_lag_secs(mount)
    timing = f"lease TTL {ttl_secs:g} s, heartbeat {heartbeat_secs:g} s ({source})"
    if lag is None:
        return LeaseAdvice(
            None,
            f"{where}: cache lag unknown for this filesystem; {timing}. Keep TTL >= 3 x (C + heartbeat), "
            "C = how long a name can show old content on a node (docs/failure-semantics.md)",
        )
    needed = 3 * (lag + heartbeat_secs)
    if ttl_secs >= needed:
        return LeaseAdvice(True, f"{where}: cache lag <= {lag:g} s; {timing} >= 3 x (C + H) = {needed:g} s")
    heartbeat = max(5.0, min(heartbeat_secs, lag / 4))
    ttl = 10 * math.ceil(3 * (lag + heartbeat) / 10)
    hint = f"set elastic.lease_ttl_secs: {ttl:g} and heartbeat_interval_secs: {heartbeat:g}"
    if mount.fstype.startswith("nfs"):
        hint += ", or mount with actimeo=3"
    return LeaseAdvice(
        False,
        f"{where}: cache lag up to {lag:g} s; {timing} < 3 x (C + H) = {needed:g} s: live holders may "
        f"look stale and their shards be done twice; {hint}",
    )
