"""One worker process's pace record ``summary/paces/<worker>.json``: the claims it holds, how fast
it finishes shards, whether it left.  A hint (docs/leases-on-nfs.md, item 8): a missing or stale
one only shows a held shard as free (a claimer probes it) or a node's pace as unknown.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import ClassVar

from loguru import logger

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.jobdir import confine
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.jobdir.records import Record
from data_juicer_elastic.sharedfs import fsio
from data_juicer_elastic.sharedfs.identity import WorkerIdentity, safe_name


@dataclass(frozen=True)
class HeldClaim:
    shard_id: str
    generation: int
    attempt_id: str


@dataclass(frozen=True)
class PaceRecord(Record):
    KIND: ClassVar[str] = "pace"
    worker: str  # this record's key (node, pid and a random part: unique per process)
    node_id: str
    hostname: str
    boot_id: str
    pid_namespace: str
    pid: int
    seq: int  # +1 per write
    updated_at: float  # writer's wall clock (display only)
    held: list[HeldClaim] = field(default_factory=list)
    done: int = 0  # this process's accepted results
    first_secs: float | None = None  # its first accepted attempt's duration (its runtime's start included)
    warm_secs: float = 0.0  # the sum of the other accepted attempts' durations
    rows_out: int = 0
    stopped: bool = False  # the process left; it holds nothing
    rows_in: int = 0  # input rows of its accepted results
    quarantined: int = 0  # rows its accepted results set aside (jobdir.row_errors)
    first_claimed_at: float | None = None  # wall clock of its first claim (display only)
    last_done_at: float | None = None  # wall clock of its latest accepted result (display only)

    @property
    def warm_count(self) -> int:
        return max(self.done - 1, 0)


def worker_key(identity: WorkerIdentity) -> str:
    """A key for this process's record: readable, and unique even where pids repeat (containers)."""
    return f"{safe_name(identity.node_id)[:60]}-{identity.pid}-{secrets.token_hex(4)}"


def read_pace(layout: JobLayout, name: str) -> PaceRecord | None:
    """The record behind a ``paces/`` listing name; None when it is gone, foreign or corrupt."""
    if not name.endswith(".json") or name.startswith("."):
        return None
    try:
        return PaceRecord.read(layout.pace(name[: -len(".json")]))
    except (OSError, JobDirError):
        return None


def read_paces(layout: JobLayout) -> list[PaceRecord]:
    """Every readable pace record of the job: one listing of ``paces/``, read a few at a time."""
    return list(refresh_paces(layout, {}).values())


def refresh_paces(layout: JobLayout, previous: dict[str, PaceRecord]) -> dict[str, PaceRecord]:
    """The job's pace records by name; one in ``previous`` that said it stopped is not read again."""
    names = fsio.list_names(layout.paces_dir)
    known = {name: previous[name] for name in names if name in previous and previous[name].stopped}
    unread = [name for name in names if name not in known]
    fresh = dict(zip(unread, fsio.read_many(lambda name: read_pace(layout, name), unread), strict=True))
    records = {name: known.get(name) or fresh.get(name) for name in names}
    return {name: record for name, record in records.items() if record is not None}


class PaceWriter:
    """This process's pace record: updated in memory, written when it changed (thread-safe:
    the claim-ahead helper claims too)."""

    def __init__(self, layout: JobLayout, identity: WorkerIdentity):
        self.layout = layout
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        # the record carries the process's whole identity (node, host, boot, pid namespace, pid)
        self._record = PaceRecord(worker=worker_key(identity), seq=0, updated_at=time.time(), **asdict(identity))
        self._dirty = True
        self._dir_ready = False

    @property
    def key(self) -> str:
        return self._record.worker

    def holding(self, shard_id: str, generation: int, attempt_id: str) -> None:
        now = time.time()
        self._change(
            lambda r: replace(
                r,
                held=[*r.held, HeldClaim(shard_id, generation, attempt_id)],
                first_claimed_at=r.first_claimed_at if r.first_claimed_at is not None else now,
            )
        )

    def let_go(self, shard_id: str, generation: int) -> None:
        self._change(
            lambda r: replace(r, held=[h for h in r.held if (h.shard_id, h.generation) != (shard_id, generation)])
        )

    def finished(
        self, secs: float, rows: int, rows_in: int = 0, quarantined: int = 0, *, shard: HeldClaim | None = None
    ) -> None:
        """One accepted result of this process, ``secs`` on its own clock.  ``shard``: the claim it
        published, no longer listed as held in the same change, so a record never both counts a
        result and holds its claim: a reader counts a done shard that a record still holds from its
        done marker (``status.done_tally``: the process died between its done marker and this)."""

        now = time.time()

        def add(r: PaceRecord) -> PaceRecord:
            held = [
                h for h in r.held if shard is None or (h.shard_id, h.generation) != (shard.shard_id, shard.generation)
            ]
            counts = dict(
                rows_out=r.rows_out + rows,
                rows_in=r.rows_in + rows_in,
                quarantined=r.quarantined + quarantined,
                last_done_at=now,
                held=held,
            )
            if r.done == 0:
                return replace(r, done=1, first_secs=secs, **counts)
            return replace(r, done=r.done + 1, warm_secs=r.warm_secs + secs, **counts)

        self._change(add)

    def _change(self, change) -> None:
        with self._lock:
            self._record = change(self._record)
            self._dirty = True

    def flush(self, *, stopped: bool = False) -> bool:
        """Write the record if it changed; errors are logged (a pace record is a hint)."""
        with self._write_lock:  # writes in seq order: an older record never lands last
            with self._lock:
                if stopped:
                    self._record = replace(self._record, held=[], stopped=True)
                    self._dirty = True
                if not self._dirty:
                    return False
                self._record = replace(self._record, seq=self._record.seq + 1, updated_at=time.time())
                record, self._dirty = self._record, False
            try:
                path = self.layout.pace(record.worker)
                if not self._dir_ready:
                    confine.ensure_dir(self.layout, path.parent)
                    self._dir_ready = True
                fsio.atomic_write(path, record.encode(), durable=False)
            except (OSError, JobDirError) as exc:
                logger.warning(f"could not write this worker's pace record: {exc}")
                with self._lock:
                    self._dirty = True
                return False
            return True
